//go:build unix

package testenv

import "syscall"

// Pause stops the server (SIGSTOP): its connections stay open, unanswered.
func (r *Redis) Pause() { r.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume lets a paused server run again.
func (r *Redis) Resume() { r.cmd.Process.Signal(syscall.SIGCONT) }
