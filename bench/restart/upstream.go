//go:build linux

package main

import (
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

// upstream answers the names of the reference workload as an authoritative
// server would (workload.Reply), over UDP and TCP on one port of 127.0.0.1,
// and notes when it was asked for each: the queries the cache did not
// answer itself.
type upstream struct {
	*harness.Server
	names map[string]int32

	mu    sync.Mutex
	asked []int64 // unix nanoseconds
}

func startUpstream(names *workload.Names) (*upstream, error) {
	u := &upstream{names: make(map[string]int32, names.Len())}
	for i := range names.Len() {
		u.names[names.Name(i)] = int32(i)
	}
	var err error
	u.Server, err = harness.Serve(u)
	return u, err
}

// ServeDNS answers a workload name with its reply and any other with
// NXDOMAIN, not counted: the probes that wait for a server to answer.
func (u *upstream) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if len(r.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeFormatError)
		w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	i, ok := u.names[strings.ToLower(q.Name)]
	if !ok {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		w.WriteMsg(m)
		return
	}
	u.mu.Lock()
	u.asked = append(u.asked, time.Now().UnixNano()) // under the lock: in order
	u.mu.Unlock()
	m := workload.Reply(int(i), workload.Plain)
	m.Id = r.Id
	m.Question[0] = q
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if o := r.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

// Asked returns the number of queries for workload names from start to
// end, end excluded.
func (u *upstream) Asked(start, end time.Time) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	from := sort.Search(len(u.asked), func(k int) bool { return u.asked[k] >= start.UnixNano() })
	to := sort.Search(len(u.asked), func(k int) bool { return u.asked[k] >= end.UnixNano() })
	return to - from
}
