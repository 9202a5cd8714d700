package outbox

import "time"

// Backoff is the delay a sender draws after its n-th failed attempt.
func (s *Sender) Backoff(n int) time.Duration { return s.backoff(n) }
