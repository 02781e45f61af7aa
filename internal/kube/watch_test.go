package kube

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// fakeAPI answers a watch of its own as an API server would, with no
// Services and no EndpointSlices; while refuse is set, it refuses watches
// of EndpointSlices with 403, as it does where RBAC allows the watch's
// list but not its watch, each once the test has taken it from asked and
// let it go on release.
type fakeAPI struct {
	refuse   atomic.Bool
	asked    chan struct{} // a refused watch waits for the test to take it
	release  chan struct{}
	endEps   chan struct{} // ends the open watch of EndpointSlices
	epsLists atomic.Int64
	// epsWatches counts the watches of EndpointSlices held open.
	epsWatches atomic.Int64
	// svcWatches, if not nil, has the query of each watch of Services.
	svcWatches chan url.Values
}

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind := ""
	switch r.URL.Path {
	case "/readyz":
		fmt.Fprint(w, "ok")
		return
	case "/api/v1/services":
		kind = "Service"
	case "/apis/discovery.k8s.io/v1/endpointslices":
		kind = "EndpointSlice"
	default:
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	switch {
	case q.Get("sendInitialEvents") == "true":
		// No watch-list: the reflector lists.
		status(w, http.StatusBadRequest, "BadRequest")
	case q.Get("watch") == "true" && kind == "EndpointSlice" && a.refuse.Load():
		select {
		case a.asked <- struct{}{}:
			select {
			case <-a.release:
				status(w, http.StatusForbidden, "Forbidden")
			case <-r.Context().Done():
			}
		case <-r.Context().Done():
		}
	case q.Get("watch") == "true":
		if kind == "Service" && a.svcWatches != nil {
			select {
			case a.svcWatches <- q:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		end := a.endEps
		if kind != "EndpointSlice" {
			end = nil
		} else {
			a.epsWatches.Add(1)
			defer a.epsWatches.Add(-1)
		}
		select {
		case <-r.Context().Done():
		case <-end:
		}
	default:
		if kind == "EndpointSlice" {
			a.epsLists.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		apiVersion := map[string]string{"Service": "v1", "EndpointSlice": "discovery.k8s.io/v1"}[kind]
		fmt.Fprintf(w, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"1"},"items":[]}`, kind+"List", apiVersion)
	}
}

func status(w http.ResponseWriter, code int, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`, strings.ToLower(reason), reason, code)
}

// waitState waits for the watch's state to say up, and returns why not
// if it does not within the deadline.
func waitState(w *watch, up bool, d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		got, why := w.state()
		if got == up || time.Now().After(deadline) {
			return why
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatchFailsUntilWatching: a watch whose EndpointSlices' watch is
// refused fails until a watch of them starts again, however long the
// reflector's backoff between its tries (30 to 60 s once failures
// persist) and whatever lists succeed between, and follows again as soon
// as one starts.
func TestWatchFailsUntilWatching(t *testing.T) {
	api := &fakeAPI{asked: make(chan struct{}), release: make(chan struct{}), endEps: make(chan struct{})}
	srv := httptest.NewServer(api) // on 127.0.0.1, port 0
	defer srv.Close()
	w, err := startWatch(&rest.Config{Host: srv.URL}, silentAfter)
	if err != nil {
		t.Fatal(err)
	}
	defer w.cancel()
	if why := waitState(w, true, 5*time.Second); why != "" {
		t.Fatalf("not following the fake API server: %s", why)
	}
	// asked waits for the reflector's next watch of the EndpointSlices,
	// held until the test releases it, refused.
	asked := func() {
		t.Helper()
		select {
		case <-api.asked:
		case <-time.After(10 * time.Second):
			t.Fatal("the reflector did not watch the EndpointSlices again within 10 s")
		}
	}

	// Synced once listed: its first watch may come later, and would be
	// refused before the test ends it.
	for deadline := time.Now().Add(5 * time.Second); api.epsWatches.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reflector did not watch the EndpointSlices within 5 s")
		}
	}
	api.refuse.Store(true)
	api.endEps <- struct{}{} // the reflector watches again, and is refused
	asked()
	api.release <- struct{}{}
	if why := waitState(w, false, 5*time.Second); !strings.Contains(why, "fails") {
		t.Fatalf("following while the EndpointSlices' watch is refused (%q)", why)
	}
	lists := api.epsLists.Load()
	asked() // the reflector's next try: a list, then the watch
	if api.epsLists.Load() == lists {
		t.Fatal("the reflector watched again without listing")
	}
	if up, why := w.state(); up {
		t.Errorf("following once the EndpointSlices are listed but their watch not yet answered (%q)", why)
	}
	api.refuse.Store(false)
	api.release <- struct{}{}
	if why := waitState(w, true, 15*time.Second); why != "" {
		t.Errorf("not following once the EndpointSlices are watched again: %s", why)
	}
}

// TestWatchRestartsSilent: a watch the API server holds open and sends
// nothing on, not even the bookmarks it sends about every minute to a
// watch that allows them, has stalled: it is ended once silent for the
// deadline and watched again, from where it was.
func TestWatchRestartsSilent(t *testing.T) {
	api := &fakeAPI{svcWatches: make(chan url.Values)}
	srv := httptest.NewServer(api) // on 127.0.0.1, port 0
	defer srv.Close()
	w, err := startWatch(&rest.Config{Host: srv.URL}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer w.cancel()
	for i := range 2 {
		select {
		case q := <-api.svcWatches:
			if q.Get("allowWatchBookmarks") != "true" {
				t.Fatalf("watch %d of Services allows no bookmarks: %v", i, q)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no watch %d of Services within 10 s: a silent watch is not restarted", i)
		}
	}
}
