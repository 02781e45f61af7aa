package flights

import (
	"testing"

	"github.com/miekg/dns"
)

// TestLandReportsWaiters: the miss path recycles a fetch only when land says
// nobody waited on its flight; a waiter reads the flight after it lands.
func TestLandReportsWaiters(t *testing.T) {
	var fs Flights
	var alone, shared Flight
	f, leader, _ := fs.Join(1, false, &alone)
	if !leader || fs.Land(f, nil, dns.RcodeSuccess, nil) {
		t.Fatalf("a flight nobody joined: leader %v, land reported waiters", leader)
	}
	f, _, _ = fs.Join(2, false, &shared)
	if w, leader, _ := fs.Join(2, false, new(Flight)); leader || w != f {
		t.Fatalf("a second request for key 2 leads (%v) or joins another flight", leader)
	}
	reply := new(dns.Msg)
	if !fs.Land(f, reply, dns.RcodeSuccess, nil) {
		t.Fatal("a flight with a waiter: land reported none")
	}
	<-f.Done
	if f.Reply != reply {
		t.Fatal("the waiter does not see the landed reply")
	}
	if n := fs.InFlight(); n != 0 {
		t.Fatalf("%d flights left after both landed", n)
	}
}

// TestFlightsShareAList: flights whose keys fall in one list are told apart
// by key, and landing any of them, first, last or in between, leaves the
// others to be joined.
func TestFlightsShareAList(t *testing.T) {
	keys := []uint64{3, 3 + numLists, 3 + 2*numLists}
	for _, first := range keys {
		var fs Flights
		led := map[uint64]*Flight{}
		for _, k := range keys {
			f, leader, _ := fs.Join(k, false, new(Flight))
			if !leader {
				t.Fatalf("key %d joined a flight of another key", k)
			}
			led[k] = f
		}
		fs.Land(led[first], nil, dns.RcodeSuccess, nil)
		for _, k := range keys {
			f, leader, _ := fs.Join(k, false, new(Flight))
			if k == first {
				if !leader {
					t.Errorf("landed %d first: a new request for it joins the landed flight", first)
				}
				continue
			}
			if leader || f != led[k] {
				t.Errorf("landed %d first: a request for %d leads (%v) or joins another flight", first, k, leader)
			}
		}
		if n := fs.InFlight(); n != len(keys) {
			t.Errorf("landed %d first, then led it again: %d flights, want %d", first, n, len(keys))
		}
	}
}

// TestFlightsDO: a DO miss joins only a flight that stores the DNSSEC
// records it needs; a miss without DO joins either kind.
func TestFlightsDO(t *testing.T) {
	for _, tc := range []struct {
		name         string
		leader, join bool // the DO bits of the leader and of the second miss
		joins        bool
	}{
		{"non-DO joins non-DO", false, false, true},
		{"non-DO joins DO", true, false, true},
		{"DO leads beside non-DO", false, true, false},
		{"DO joins DO", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fs Flights
			lead, _, _ := fs.Join(7, tc.leader, new(Flight))
			f, leader, _ := fs.Join(7, tc.join, new(Flight))
			if joined := !leader && f == lead; joined != tc.joins {
				t.Fatalf("the second miss joined the leader's flight: %v, want %v", joined, tc.joins)
			}
			// A miss without DO that comes next joins one of them.
			if _, leader, _ := fs.Join(7, false, new(Flight)); leader {
				t.Error("a third miss, without DO, leads a flight of its own")
			}
			fs.Land(lead, nil, dns.RcodeSuccess, nil)
			if f != lead {
				fs.Land(f, nil, dns.RcodeSuccess, nil)
			}
			if n := fs.InFlight(); n != 0 {
				t.Errorf("%d flights left after all landed", n)
			}
		})
	}
}

// TestJoinAfterLanding: a leader learns that the flight landed last in its
// list was for its key, so that it looks its key up again; not when the
// last was another key's, nor a waiter.
func TestJoinAfterLanding(t *testing.T) {
	const key = 5
	for _, tc := range []struct {
		name   string
		landed []uint64 // the keys whose flights land, in order, before the join
		want   bool
	}{
		{"nothing landed", nil, false},
		{"its key landed", []uint64{key}, true},
		{"another list's key landed after", []uint64{key, key + 1}, true},
		{"its list's other key landed after", []uint64{key, key + numLists}, false},
		{"its key landed after another", []uint64{key + numLists, key}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fs Flights
			for _, k := range tc.landed {
				f, _, _ := fs.Join(k, false, new(Flight))
				fs.Land(f, nil, dns.RcodeSuccess, nil)
			}
			f, leader, landed := fs.Join(key, false, new(Flight))
			if !leader || landed != tc.want {
				t.Fatalf("leader %v, landed %v; want a leader, landed %v", leader, landed, tc.want)
			}
			if _, leader, landed := fs.Join(key, false, new(Flight)); leader || landed {
				t.Errorf("a second request: leader %v, landed %v; want a waiter, not told", leader, landed)
			}
			fs.Land(f, nil, dns.RcodeSuccess, nil)
		})
	}
}
