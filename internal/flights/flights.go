// Package flights coalesces the fetches of misses: a thousand clients
// asking one new name cost one upstream query. Every miss joins a flight
// by its key and lands it, and nearly all lead theirs alone, so joining
// and landing are what coalescing costs a miss: a flight lives in memory
// the caller owns and is linked into one of a fixed set of locked lists,
// with no allocation and no map.
package flights

import (
	"sync"
	"unsafe"

	"github.com/miekg/dns"
)

// Flights are the fetches of misses in flight, by key. A map's insert and
// delete (the delete reseeds a map it empties) would cost a miss more than
// the rest of coalescing; the lists are locked apart, so that misses on
// different cores seldom wait on one lock.
type Flights struct {
	lists [numLists]list
}

// numLists is the number of lists: at the front end's default of 1,024
// requests in the chain, all misses, about sixteen flights a list.
const numLists = 64

// list is the flights whose keys are equal modulo numLists. Each
// list is padded to a cache line's size, so that misses on two cores
// locking neighbouring lists seldom take a line from each other (the lists
// are not aligned to lines: two neighbours may share one).
type list struct {
	mu     sync.Mutex
	head   *Flight
	landed uint64 // the key of the flight that landed last
	_      [cacheLine - unsafe.Sizeof(sync.Mutex{}) - unsafe.Sizeof((*Flight)(nil)) - unsafe.Sizeof(uint64(0))]byte
}

const cacheLine = 64

// Flight is one fetch; Done, made when a second request joins it, closes
// when Reply, Rcode and Err are set.
type Flight struct {
	key    uint64
	dnssec bool    // led by a DO client: the entry it stores serves DO clients too
	next   *Flight // the next flight in its list
	joined int     // the requests that joined it, to wait for it
	Done   chan struct{}
	Reply  *dns.Msg
	Rcode  int
	Err    error
}

func (fs *Flights) listOf(key uint64) *list { return &fs.lists[key%numLists] }

// Join returns the flight for key, and whether the caller leads it: the
// leader fetches and lands it, the others wait for it to land. A leader's
// flight is lead, the caller's memory. A DO client (dnssec) joins only a
// flight led by another: the entry a fetch for a client without DO stores
// has no DNSSEC records, and the DO client's own fetch is what upgrades it.
// A client without DO joins either.
//
// A miss looks its key up before it joins, so a flight of the key can land,
// its entry stored, in between: the miss then leads a second fetch for an
// entry now in the cache, and a crowd of clients asking one name as its
// entry expires makes several. landed tells a leader that the flight which
// landed last in the key's list was for its key, so that it looks again
// before it fetches; it is a hint, lost when another key of the list lands
// in between, but exact for the one hot name that crowds ask for.
func (fs *Flights) Join(key uint64, dnssec bool, lead *Flight) (f *Flight, leader, landed bool) {
	l := fs.listOf(key)
	l.mu.Lock()
	defer l.mu.Unlock()
	for f := l.head; f != nil; f = f.next {
		if f.key != key || dnssec && !f.dnssec {
			continue
		}
		// The first waiter makes done: most flights have none, and the
		// channel would be a second allocation per miss.
		if f.Done == nil {
			f.Done = make(chan struct{})
		}
		f.joined++
		return f, false, false
	}
	*lead = Flight{key: key, dnssec: dnssec, next: l.head}
	l.head = lead
	return lead, true, l.landed == key
}

// Land publishes the outcome of f to its waiters, and reports whether there
// were any. They read it once done closes; done is made under the lock,
// before land takes f out of its list.
func (fs *Flights) Land(f *Flight, reply *dns.Msg, rcode int, err error) (waited bool) {
	f.Reply, f.Rcode, f.Err = reply, rcode, err
	l := fs.listOf(f.key)
	l.mu.Lock()
	for p := &l.head; *p != nil; p = &(*p).next {
		if *p == f {
			*p, f.next = f.next, nil // its waiters keep f, not the flight after it
			break
		}
	}
	l.landed = f.key
	done := f.Done
	l.mu.Unlock()
	if done != nil {
		close(done)
	}
	return done != nil
}

// InFlight returns the flights in flight.
func (fs *Flights) InFlight() int {
	n, _ := fs.Waiting()
	return n
}

// Waiting returns the flights in flight, and the requests that joined them to
// wait for them.
func (fs *Flights) Waiting() (flights, waiters int) {
	for i := range fs.lists {
		l := &fs.lists[i]
		l.mu.Lock()
		for f := l.head; f != nil; f = f.next {
			flights++
			waiters += f.joined
		}
		l.mu.Unlock()
	}
	return flights, waiters
}
