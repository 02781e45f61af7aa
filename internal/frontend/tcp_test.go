package frontend

import (
	"net"
	"testing"
	"time"
)

// deadlineConn keeps the read deadline set on it.
type deadlineConn struct {
	net.Conn
	deadline time.Time
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.deadline = t
	return nil
}

// TestConnsOutcome: a connection's reader that starts to wait for a
// request, or to read one, goes on, or leaves: handing the connection on
// when the front end closes, evicted or not, else closing it when it was
// evicted. Only one that goes on changes state, and only a wait that goes
// on sets the read deadline, which would undo close's or evict's.
func TestConnsOutcome(t *testing.T) {
	deadline := time.Unix(100, 0)
	wait := func(c *conns, conn net.Conn) outcome { return c.wait(conn, deadline) }
	for _, tc := range []struct {
		name    string
		call    func(*conns, net.Conn) outcome
		to      connState // where call has the reader go
		from    connState
		closing bool
		want    outcome
	}{
		{"wait, first", wait, waiting, starting, false, goOn},
		{"wait, next", wait, waiting, reading, false, goOn},
		{"wait, evicted", wait, waiting, evicted, false, leave},
		{"wait, closing", wait, waiting, reading, true, handOn},
		{"wait, evicted and closing", wait, waiting, evicted, true, handOn},
		{"reading", (*conns).reading, reading, waiting, false, goOn},
		{"reading, evicted", (*conns).reading, reading, evicted, false, leave},
		{"reading, closing", (*conns).reading, reading, waiting, true, handOn},
		{"reading, evicted and closing", (*conns).reading, reading, evicted, true, handOn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := &deadlineConn{}
			c := &conns{m: map[net.Conn]connState{conn: tc.from}, closing: tc.closing}
			if got := tc.call(c, conn); got != tc.want {
				t.Errorf("outcome %d, want %d", got, tc.want)
			}
			state := tc.from
			if tc.want == goOn {
				state = tc.to
			}
			if c.m[conn] != state {
				t.Errorf("state %d, want %d", c.m[conn], state)
			}
			if set, want := !conn.deadline.IsZero(), tc.want == goOn && tc.to == waiting; set != want {
				t.Errorf("read deadline set %v, want %v", set, want)
			}
		})
	}
}
