//go:build !unix

package testenv

// Pause fails the test: stopping a process and letting it run on needs
// Unix's signals.
func (r *Redis) Pause() { r.tb.Fatal("testenv: Redis.Pause needs SIGSTOP, which only Unix has") }

// Resume has nothing to do, as nothing can be paused.
func (r *Redis) Resume() {}
