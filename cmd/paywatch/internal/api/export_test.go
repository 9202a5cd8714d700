package api

// SetMaxWaiting lowers how many long-polls may wait at once (MaxWaiting in
// the daemon), so that tests reach the limit with a few requests.
func (s *Server) SetMaxWaiting(n int64) { s.maxWaiting = n }

// MaxWaitingLimit is how many long-polls may wait at once.
func (s *Server) MaxWaitingLimit() int64 { return s.maxWaiting }
