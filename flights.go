package compactcache

import (
	"sync"
	"unsafe"

	"github.com/miekg/dns"
)

// flights are the fetches of misses in flight, by flightKey, for request
// coalescing: a thousand clients asking one new name cost one upstream query.
//
// Every miss joins a flight and lands it, and nearly all lead theirs alone,
// so the two are what coalescing costs a miss. A flight lives in the miss's
// pooled fetch and is linked into one of flightLists lists by its key: no
// allocation, and no map, whose insert and delete (the delete reseeds a map
// it empties) cost a miss more than the rest of coalescing. The lists are
// locked apart, so that misses on different cores seldom wait on one lock.
type flights struct {
	lists [flightLists]flightList
}

// flightLists is the number of lists: at the front end's default of 1,024
// requests in the chain, all misses, about sixteen flights a list.
const flightLists = 64

// flightList is the flights whose keys are equal modulo flightLists. Each
// list is padded to a cache line's size, so that misses on two cores
// locking neighbouring lists seldom take a line from each other (the lists
// are not aligned to lines: two neighbours may share one).
type flightList struct {
	mu   sync.Mutex
	head *flight
	_    [cacheLine - unsafe.Sizeof(sync.Mutex{}) - unsafe.Sizeof((*flight)(nil))]byte
}

const cacheLine = 64

// flight is one fetch; done, made when a second request joins it, closes
// when reply, rcode and err are set.
type flight struct {
	key    uint64
	dnssec bool    // led by a DO client: the entry it stores serves DO clients too
	next   *flight // the next flight in its list
	done   chan struct{}
	reply  *dns.Msg
	rcode  int
	err    error
}

func (fs *flights) list(key uint64) *flightList { return &fs.lists[key%flightLists] }

// join returns the flight for key, and whether the caller leads it: the
// leader fetches and lands it, the others wait for it to land. A leader's
// flight is lead, the caller's memory. A DO client (dnssec) joins only a
// flight led by another: the entry a fetch for a client without DO stores
// has no DNSSEC records, and the DO client's own fetch is what upgrades it.
// A client without DO joins either.
func (fs *flights) join(key uint64, dnssec bool, lead *flight) (*flight, bool) {
	l := fs.list(key)
	l.mu.Lock()
	defer l.mu.Unlock()
	for f := l.head; f != nil; f = f.next {
		if f.key != key || dnssec && !f.dnssec {
			continue
		}
		// The first waiter makes done: most flights have none, and the
		// channel would be a second allocation per miss.
		if f.done == nil {
			f.done = make(chan struct{})
		}
		return f, false
	}
	*lead = flight{key: key, dnssec: dnssec, next: l.head}
	l.head = lead
	return lead, true
}

// land publishes the outcome of f to its waiters, and reports whether there
// were any. They read it once done closes; done is made under the lock,
// before land takes f out of its list.
func (fs *flights) land(f *flight, reply *dns.Msg, rcode int, err error) (waited bool) {
	f.reply, f.rcode, f.err = reply, rcode, err
	l := fs.list(f.key)
	l.mu.Lock()
	for p := &l.head; *p != nil; p = &(*p).next {
		if *p == f {
			*p, f.next = f.next, nil // its waiters keep f, not the flight after it
			break
		}
	}
	done := f.done
	l.mu.Unlock()
	if done != nil {
		close(done)
	}
	return done != nil
}
