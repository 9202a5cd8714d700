package outbox

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Backoff is the delay a sender draws after its n-th failed attempt.
func (s *Sender) Backoff(n int) time.Duration { return s.backoff(n) }

// CoolingDelay is how long an order waits after its n-th attempt in a row
// that could not be recorded.
func CoolingDelay(n int) time.Duration { return coolingDelay(n) }

// Round seals what is unsealed, gives up on events past their retry age
// (one that waited behind an earlier event of its order all that time
// too), and sends one batch of due events, Parallel at a time, waiting for
// them all: one step of what Run does, for the tests to drive. It returns
// how many it attempted.
func (s *Sender) Round(ctx context.Context) (int, error) {
	due, err := s.due(ctx, s.now(), nil, true)
	if err != nil && len(due) == 0 {
		return 0, err
	}
	parallel := max(s.Parallel, 1)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	errs := make([]error, len(due), len(due)+1)
	for i, e := range due {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = s.deliver(ctx, e)
		}()
	}
	wg.Wait()
	return len(due), errors.Join(append(errs, err)...)
}
