package outbox

import "time"

// Backoff is the delay a sender draws after its n-th failed attempt.
func (s *Sender) Backoff(n int) time.Duration { return s.backoff(n) }

// CoolingDelay is how long an order waits after its n-th attempt in a row
// that could not be recorded.
func CoolingDelay(n int) time.Duration { return coolingDelay(n) }
