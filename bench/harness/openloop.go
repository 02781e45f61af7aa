package harness

// OpenLoop sends DNS queries at a fixed rate, each on its schedule whether
// earlier ones were answered or not (open loop: a slow server does not slow
// the load down and hide its own latency), and keeps when each was sent and
// how long its answer took, so that a phase's latency can be read in
// stretches (a flush, a snapshot write).

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Sample is one query of a load phase.
type Sample struct {
	Sent    time.Time
	Latency time.Duration // 0: lost
}

// Phase is what a load phase measured, in the order the queries went out.
type Phase struct {
	Samples []Sample
}

// socks is how many sockets a phase sends from: the server reads from
// several, as it would from several clients.
const socks = 4

// OpenLoop sends query(k, buf) for k = 0, 1, ... to addr at rate q/s for at least
// d, and until during, if given (run beside the load), has called its done
// and one more second has passed. query returns the packed query; its ID is
// overwritten. Latency runs from the moment each query is written to the
// moment its answer is read.
func OpenLoop(addr string, rate int, d time.Duration, query func(k int, buf []byte) []byte, during func(done func())) (*Phase, error) {
	total := int(d.Seconds() * float64(rate))
	p := &Phase{Samples: make([]Sample, 0, total*2)}
	var mu sync.Mutex // guards p.Samples' growth against the readers
	var sentAt [socks][1 << 16]atomic.Int64
	var index [socks][1 << 16]atomic.Int64 // the sample of each ID
	conns := make([]*net.UDPConn, socks)
	ra, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	for i := range conns {
		c, err := net.DialUDP("udp", nil, ra)
		if err != nil {
			return nil, err
		}
		conns[i] = c
	}
	var readers sync.WaitGroup
	for i, c := range conns {
		readers.Go(func() {
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				now := time.Now().UnixNano()
				if n < 12 {
					continue
				}
				id := binary.BigEndian.Uint16(buf)
				sent := sentAt[i][id].Swap(0)
				if sent == 0 {
					continue
				}
				mu.Lock()
				p.Samples[index[i][id].Load()].Latency = time.Duration(now - sent)
				mu.Unlock()
			}
		})
	}

	var finished atomic.Bool
	if during != nil {
		go during(func() {
			time.AfterFunc(time.Second, func() { finished.Store(true) })
		})
	} else {
		finished.Store(true)
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	var ids [socks]uint16
	buf := make([]byte, 0, 512)
	for k := 0; ; k++ {
		due := start.Add(time.Duration(k) * interval)
		if k >= total && finished.Load() {
			break
		}
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		s := k % socks
		ids[s]++
		q := query(k, buf[:0])
		binary.BigEndian.PutUint16(q, ids[s])
		mu.Lock()
		p.Samples = append(p.Samples, Sample{})
		idx := len(p.Samples) - 1
		mu.Unlock()
		index[s][ids[s]].Store(int64(idx))
		now := time.Now()
		sentAt[s][ids[s]].Store(now.UnixNano())
		p.Samples[idx].Sent = now // read only after the readers stop
		conns[s].Write(q)
	}
	time.Sleep(time.Second) // the last answers
	for _, c := range conns {
		c.Close()
	}
	readers.Wait()
	return p, nil
}

// TypicalP99 cuts the phase into stretches of length d and returns the
// median of their p99s: what the p99 of a stretch as long as d is, on this
// machine as loaded as it was, without the phase's own rare spikes.
func (p *Phase) TypicalP99(d time.Duration) time.Duration {
	p99s := p.StretchP99s(d, nil)
	if len(p99s) == 0 {
		return p.All().Percentile(0.99)
	}
	return Median(p99s, func(d time.Duration) time.Duration { return d })
}

// Median returns the median of f over xs (of an even count, the upper of
// the middle two), the zero value of none.
func Median[T any, V cmp.Ordered](xs []T, f func(T) V) V {
	if len(xs) == 0 {
		var zero V
		return zero
	}
	v := make([]V, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// StretchP99s cuts the phase into stretches of length d from its first
// query on and returns the p99 of each that holds an answered query, but
// for those skip (when given) leaves out.
func (p *Phase) StretchP99s(d time.Duration, skip func(from, to time.Time) bool) []time.Duration {
	if len(p.Samples) == 0 {
		return nil
	}
	var p99s []time.Duration
	first, last := p.Samples[0].Sent, p.Samples[len(p.Samples)-1].Sent
	for at := first; at.Add(d).Before(last); at = at.Add(d) {
		if skip != nil && skip(at, at.Add(d)) {
			continue
		}
		if w := p.Between(at, at.Add(d)); len(w.Latencies) > 0 {
			p99s = append(p99s, w.Percentile(0.99))
		}
	}
	return p99s
}

// All returns the latencies of the phase's queries.
func (p *Phase) All() Window { return p.Between(time.Time{}, time.Time{}) }

// Window is the sorted latencies of the answered queries of a stretch of a
// phase, and the count of those lost.
type Window struct {
	Latencies []time.Duration
	Lost      int
}

// Between returns the queries sent from start to end, end excluded (zero:
// no end), so that stretches end to end share no query.
func (p *Phase) Between(start, end time.Time) Window {
	return p.Where(func(sent time.Time) bool {
		return !sent.Before(start) && (end.IsZero() || sent.Before(end))
	})
}

// Where returns the queries whose send time in accepts.
func (p *Phase) Where(in func(sent time.Time) bool) Window {
	var w Window
	for _, s := range p.Samples {
		switch {
		case !in(s.Sent):
		case s.Latency == 0:
			w.Lost++
		default:
			w.Latencies = append(w.Latencies, s.Latency)
		}
	}
	slices.Sort(w.Latencies)
	return w
}

// Sent returns the number of queries sent from start to end, end excluded.
func (p *Phase) Sent(start, end time.Time) int {
	w := p.Between(start, end)
	return len(w.Latencies) + w.Lost
}

// Percentile returns the q-quantile of the window's latencies, 0 if none.
func (w Window) Percentile(q float64) time.Duration {
	if len(w.Latencies) == 0 {
		return 0
	}
	return w.Latencies[min(len(w.Latencies)-1, int(q*float64(len(w.Latencies))))]
}

// String gives the queries, losses and percentiles, in microseconds.
func (w Window) String() string {
	us := func(q float64) int64 { return w.Percentile(q).Microseconds() }
	return fmt.Sprintf("%d answered, %d lost, latency µs p50 %d p99 %d p99.9 %d max %d",
		len(w.Latencies), w.Lost, us(0.5), us(0.99), us(0.999), us(1))
}
