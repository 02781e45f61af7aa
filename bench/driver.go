package bench

import (
	"context"

	"github.com/compactcache/compactcache/internal/workload"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// Driver sends the workload's queries to a handler as the server does, one
// at a time, reusing one request and one Writer.
type Driver struct {
	Variant workload.Variant
	W       *Writer

	names *workload.Names
	req   *dns.Msg
}

// NewDriver returns a Driver whose qnames come from names, or are built for
// each query (one allocation) when names is nil.
func NewDriver(v workload.Variant, names *workload.Names) *Driver {
	return &Driver{Variant: v, W: NewWriter(), names: names, req: workload.NewRequest(0, v)}
}

func (d *Driver) set(i int) {
	var name string
	if d.names != nil {
		name = d.names.Name(i)
	} else {
		name = workload.Name(i)
	}
	workload.SetRequest(d.req, i, d.Variant, name)
}

func (d *Driver) hit(h plugin.Handler) error {
	_, err := h.ServeDNS(context.Background(), d.W, d.req)
	return err
}

// Query sends entry i's query to h with i in its context, so that a miss
// reaches the upstream. The context costs two allocations (the context and
// the boxed index).
func (d *Driver) Query(h plugin.Handler, i int) error {
	d.set(i)
	_, err := h.ServeDNS(WithIndex(context.Background(), i), d.W, d.req)
	return err
}

// Hit sends entry i's query to h without its index: it allocates nothing, and
// if the entry is not cached the upstream fails the query.
func (d *Driver) Hit(h plugin.Handler, i int) error {
	d.set(i)
	return d.hit(h)
}

// HitBatch sends query j of b to h as Hit does, with the name b holds.
func (d *Driver) HitBatch(h plugin.Handler, b *Batch, j int) error {
	i, name := b.query(j)
	workload.SetRequest(d.req, i, d.Variant, name)
	return d.hit(h)
}
