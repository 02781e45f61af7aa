package bench

import (
	"errors"
	"fmt"

	"github.com/compactcache/compactcache/internal/workload"

	"github.com/coredns/coredns/plugin"
)

// Verify sends the query of every entry in [0, n) to h as a hit (no index
// for the upstream, so that a miss fails) and checks each reply: one written,
// the request's ID, NOERROR, and the payload of the entry's records. It
// returns the entries' total payload.
func Verify(h plugin.Handler, d *Driver, up *Upstream, n int) (int, error) {
	calls := up.Calls()
	payload := 0
	for i := range n {
		writes := d.W.Writes()
		if err := d.Hit(h, i); err != nil {
			if errors.Is(err, ErrNoIndex) {
				return 0, fmt.Errorf("entry %d of %d is not stored: its query reached the upstream", i, n)
			}
			return 0, fmt.Errorf("entry %d: %v", i, err)
		}
		if w := d.W.Writes() - writes; w != 1 {
			return 0, fmt.Errorf("entry %d: %d replies written", i, w)
		}
		m, err := d.W.Reply()
		if err != nil {
			return 0, fmt.Errorf("entry %d: %v", i, err)
		}
		want := workload.PayloadOf(workload.Reply(i, d.Variant))
		if got := workload.PayloadOf(m); m.Id != uint16(i) || m.Rcode != 0 || got != want {
			return 0, fmt.Errorf("entry %d: reply ID %d, rcode %d, payload %d; want ID %d, rcode 0, payload %d",
				i, m.Id, m.Rcode, got, uint16(i), want)
		}
		payload += want
	}
	if calls := up.Calls() - calls; calls != 0 {
		return 0, fmt.Errorf("%d of %d entries reached the upstream", calls, n)
	}
	return payload, nil
}
