// Package tier is a block's shared second tier on Redis or Valkey: what
// one replica of a cluster's DNS fetched, every replica serves. On a local
// miss the block asks the tier before the next plugin (Get), within a
// latency budget; what it stores locally it hands to the tier (Put), which
// writes it in the background, pipelined, never on a query's path; and
// every flush applied to one replica reaches the tier and every other
// replica's local store (Flush, and the stream of flushes each replica
// reads).
//
// The tier is untrusted input. A value is the packed entry the store and
// snapshots hold, checked as a snapshot's before anything of it is used,
// and, with a secret, authenticated by an HMAC over its key and bytes, so
// that a client that can write to Redis cannot make the cache answer
// forged records (value.go). An entry's expiry is absolute: one that
// expired while in the tier is never served as fresh.
//
// Flushes do not scan Redis. A flush of a name or zone records its time
// under the name's or zone's epoch key, a flush of every negative entry,
// of expired ones or of all under a global one, and a lookup reads, in the
// same round trip as the value, the epochs of the name, of each zone above
// it, and the globals: a value stored before a flush that covers it (one
// expired by it, for a flush of expired entries) is a miss. Epoch
// keys live as long as the longest-lived entry could. A tier at its
// maxmemory evicts them as it evicts values, and an epoch gone is a flush
// forgotten, so every value is written with its epochs (witnesses, where
// no flush wrote one): a value read without all of them is a miss, and an
// epoch written again after an eviction holds back the values stored
// before it as a flush would. The flush itself
// goes to the other replicas through a Redis stream, which a replica reads
// from where it left off after a disconnection or a reload (resume), so
// that no flush is lost
// while the stream keeps it (maxStream); one that was trimmed away before
// the replica read it makes the replica flush its store whole, and a
// stream deleted, which may have taken epochs with it, the tier too.
//
// A tier that errs or is slow is skipped by a circuit breaker
// (breaker.go); writes are dropped, not queued without bound. The server
// never waits longer than the timeout for the tier, never answers
// SERVFAIL because of it, and never holds more for it than its write queue.
//
// The client library is valkey-go: it pipelines the commands of concurrent
// requests on a few connections by itself (misses of many clients share
// round trips without a pool to size), allocates little per command,
// speaks to standalone servers, Sentinel and Cluster (which it detects)
// over TLS with ACL users, works with Redis 6 and later as well as Valkey,
// and is maintained by the Valkey project.
package tier

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/valkey-io/valkey-go"
)

var log = clog.NewWithPlugin("compactcache")

const (
	// maxBatch bounds the writes sent in one pipeline.
	maxBatch = 64
	// maxStream is about how many flushes the stream keeps.
	maxStream = 10000
	// writeTimeout bounds a batch of writes or a flush, which no query
	// waits for.
	writeTimeout = time.Second
	// streamBlock is how long a read of the stream waits for a flush.
	streamBlock = time.Second
	// reconnectMin and reconnectMax bound the wait between attempts to
	// connect, or to read the stream again after an error.
	reconnectMin, reconnectMax = 100 * time.Millisecond, 10 * time.Second
)

// Options are what a block tells its tier of itself.
type Options struct {
	Fingerprint [32]byte // the settings its entries were stored under
	Grace       int64    // seconds entries are served past their TTL
	MaxTTL      int64    // the longest TTL the block stores
	Zones, View string   // the block's labels
	// Apply flushes the block's local store for a flush another replica
	// sent.
	Apply func(flush.Flush)
	// Since, where the block's store was read from a snapshot at the
	// process's start, is when the file was written (unix seconds): the
	// flushes sent since, which the file lacks, are read (restored).
	Since int64
}

// Tier is a block's shared tier.
type Tier struct {
	cfg    *Config
	keys   keyer
	opt    Options
	id     string // this replica's, in the flushes it sends
	m      *series
	br     breaker
	client atomic.Pointer[valkey.Client] // nil until connected
	queue  chan queued                   // entries to write
	// fence is the flushes made here or received: an entry queued before
	// one that covers it is not written, lest its epoch, evicted
	// meanwhile, come back as the entry's witness, older than the flush.
	fence flush.Fence

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	logMu   sync.Mutex
	logNext map[string]time.Time // rate limit of the log lines of refused values

	badMu sync.Mutex
	bad   map[string]int64 // epochs lookups found not a time, and when: the next write replaces them

	// Where the reader of flushes is, and where one of its stream's that
	// closed before it connected stopped (resume); guarded by readers.
	read, floor string
}

// readers are the tiers of each stream of flushes, by its key, for resume.
var readers = struct {
	sync.Mutex
	m map[string][]*Tier
}{m: map[string][]*Tier{}}

// New returns the tier of cfg for a block, and starts connecting to it in
// the background: a tier that is down when the block starts only makes the
// block start without it.
func New(cfg *Config, opt Options) *Tier {
	var id [8]byte
	rand.Read(id[:])
	t := &Tier{
		cfg: cfg, keys: newKeyer(cfg.secret, keysFingerprint(opt.Fingerprint, opt.View, cfg.apart())), opt: opt, id: hex.EncodeToString(id[:]),
		m: newSeries(opt.Zones, opt.View), queue: make(chan queued, cfg.queue), logNext: map[string]time.Time{},
	}
	t.br.changed = func(from, to breakerState, err error) {
		t.m.breakerChanged(to)
		switch to {
		case open:
			log.Warningf("Shared tier %s: skipped for %v after errors: %v", cfg, t.br.backoff, err)
		case closed:
			log.Infof("Shared tier %s: answering again", cfg)
		}
	}
	if cfg.secret == nil {
		log.Warningf("Shared tier %s: no secret_file: its values are not authenticated, and whoever can write to it can make this server answer what they wrote", cfg)
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	readers.Lock()
	readers.m[t.keys.streamKey()] = append(readers.m[t.keys.streamKey()], t)
	readers.Unlock()
	t.wg.Add(2)
	go t.connect()
	go t.writer()
	return t
}

// keysFingerprint is the fingerprint of the tier's keys for a block of
// view, on ports when it must keep apart from its Corefile's blocks on
// other ports (apart). The views of a server answer a question each its
// own way (split horizon): blocks of one settings in several views may
// share a server, and must share neither values nor flushes. Without a
// view or ports the keys are those of the settings alone.
func keysFingerprint(fp [32]byte, view string, ports []string) [32]byte {
	if view != "" {
		fp = sha256.Sum256(append(append([]byte("view "), fp[:]...), view...))
	}
	ports = slices.Compact(slices.Sorted(slices.Values(ports)))
	if len(ports) == 0 {
		return fp
	}
	return sha256.Sum256(append(append([]byte("ports "), fp[:]...), strings.Join(ports, " ")...))
}

// Close stops the tier's goroutines and closes its connections.
func (t *Tier) Close() {
	t.cancel()
	t.wg.Wait()
	t.handOn()
	t.m.release()
	// At a reload the old instance still answers while its tier closes:
	// its lookups skip the tier rather than fail on the closed client and
	// open the breaker.
	if c := t.client.Swap(nil); c != nil {
		(*c).Close()
	}
}

// connect connects until it succeeds or the tier closes, then reads the
// stream of flushes.
//
// Every command the tier builds is pinned (Pin): valkey-go recycles a
// command once it has succeeded, and one that succeeded on a retry after
// its connection broke may still have been read by that connection's
// writer, with nothing ordering that read before the builder's next reuse
// of its memory (the race detector's report, in TestFlushAfterDisconnect).
func (t *Tier) connect() {
	defer t.wg.Done()
	tc := t.cfg.tlsConf
	opt := valkey.ClientOption{
		InitAddress:  t.cfg.addrs,
		Username:     t.cfg.username,
		Password:     t.cfg.password,
		SelectDB:     t.cfg.db,
		TLSConfig:    tc,
		DisableCache: true,
		ClientName:   "compactcache",
		Dialer:       net.Dialer{Timeout: time.Second, KeepAlive: time.Second},
		// A server that stops answering (SIGSTOP, a full network buffer)
		// is noticed by the lookups' timeouts; the connection is closed
		// and made again after this.
		ConnWriteTimeout: 3 * time.Second,
	}
	if t.cfg.sentinel != "" {
		opt.Sentinel = valkey.SentinelOption{MasterSet: t.cfg.sentinel, Username: t.cfg.username, Password: t.cfg.password, TLSConfig: tc, TopologyRefreshInterval: 5 * time.Second}
	}
	wait := reconnectMin
	var last string
	for {
		c, err := valkey.NewClient(opt)
		if err == nil {
			// Where the stream of flushes ends is read before the tier
			// counts as connected, so that a flush another replica sends
			// once this one uses the tier is one it reads: an end read
			// later would skip the flushes sent meanwhile.
			if last, err = t.streamEnd(c, t.keys.streamKey()); err == nil {
				t.warnEviction(c)
				t.client.Store(&c)
				log.Infof("Shared tier %s: connected", t.cfg)
				break
			}
			c.Close()
		}
		if wait == reconnectMin {
			log.Warningf("Shared tier %s: cannot connect, the block answers without it and keeps trying: %v", t.cfg, err)
		}
		select {
		case <-t.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, reconnectMax)
	}
	if t.opt.Since > 0 {
		t.restored(*t.client.Load(), t.keys.streamKey(), last)
	}
	t.readFlushes(t.resume(last))
}

// restoredSlack is how long before a snapshot was written the flushes read
// for its store (Options.Since) begin: the stream's IDs are the server's
// clock, not the block's, and the block's reader stopped before its last
// write.
const restoredSlack = time.Minute

// restored has the reader of a store read from a snapshot start at the
// flushes sent since the file was written, less restoredSlack, given end,
// the stream's end: the process was down meanwhile, and the stream's end
// lies past the flushes other replicas sent then. A stream whose first
// flush comes after that was made since, and is read from its start, or
// trimmed, and the store is flushed whole: checkLost would take the one for
// a stream deleted and flush the tier whole.
func (t *Tier) restored(c valkey.Client, stream, end string) {
	from := strconv.FormatInt(max(0, t.opt.Since-int64(restoredSlack/time.Second))*1000, 10) + "-0"
	if !idAfter(end, from, 0) {
		return // none sent since
	}
	r, err := c.Do(t.ctx, c.B().Xrange().Key(stream).Start("-").End("+").Count(1).Build().Pin()).AsXRange()
	switch {
	case err != nil && t.ctx.Err() != nil:
		return
	case err != nil || len(r) == 0:
		t.lost("the flushes sent since its snapshot was written could not be read: the local store is flushed whole")
		return
	case idAfter(r[0].ID, from, 1) && !t.madeAgain(c, stream):
		t.lost("flushes sent since its snapshot was written were trimmed from the stream: the local store is flushed whole")
		return
	case idAfter(r[0].ID, from, 1):
		from = "0-0"
	}
	readers.Lock()
	defer readers.Unlock()
	if t.floor == "" || idAfter(t.floor, from, 0) {
		t.floor = from
	}
}

// resume returns where the reader starts, given end, the stream's end
// when the tier connected, and whether flushes before end may be unread.
// At a reload the block's new instance takes over the old one's store,
// and its tier connects while or after the old one's closes: it reads on
// from where the old one's reader is, or stopped, when that comes first,
// lest a flush sent between the old reader's last read and the new one's
// connection reach neither. So does any tier of a stream another tier of
// the process reads.
func (t *Tier) resume(end string) (from string, behind bool) {
	readers.Lock()
	defer readers.Unlock()
	from = end
	earlier := func(id string) {
		if id != "" && idAfter(from, id, 0) {
			from = id
		}
	}
	earlier(t.floor)
	for _, o := range readers.m[t.keys.streamKey()] {
		if o != t {
			earlier(o.read)
		}
	}
	t.read = from
	return from, from != end
}

// handOn takes the closed tier out of its stream's readers, and hands
// where its reader stopped to those that have not connected yet (resume).
func (t *Tier) handOn() {
	readers.Lock()
	defer readers.Unlock()
	stream := t.keys.streamKey()
	rs := slices.DeleteFunc(readers.m[stream], func(o *Tier) bool { return o == t })
	for _, o := range rs {
		if o.read == "" && t.read != "" && (o.floor == "" || idAfter(o.floor, t.read, 0)) {
			o.floor = t.read
		}
	}
	if len(rs) == 0 {
		delete(readers.m, stream)
	} else {
		readers.m[stream] = rs
	}
}

// Get returns the first of keys (cache keys, in the order the block
// prefers them) whose value the tier holds, checks, and accept takes, or
// nil. name is the question's name (lowercased wire form), whose epochs
// say whether a flush covers a value; now is the block's clock, unix
// seconds. It waits at most the configured timeout. The entry is the
// caller's.
func (t *Tier) Get(ctx context.Context, keys [][]byte, name []byte, now int64, accept func(entry.Entry) bool) entry.Entry {
	cp := t.client.Load()
	if cp == nil || !t.br.allow(time.Now()) {
		t.m.skipped.inc()
		return nil
	}
	c := *cp
	tierKeys := make([]string, len(keys))
	cmds := make(valkey.Commands, 0, len(keys)+3+2*countLabels(name))
	for i, k := range keys {
		tierKeys[i] = t.keys.key(k)
		cmds = append(cmds, c.B().Get().Key(tierKeys[i]).Build().Pin())
	}
	epochs := len(cmds)
	t.keys.epochs(name, func(key string) { cmds = append(cmds, c.B().Get().Key(key).Build().Pin()) })
	asked := ctx
	ctx, cancel := context.WithTimeout(ctx, t.cfg.timeout)
	defer cancel()
	start := time.Now()
	res := c.DoMulti(ctx, cmds...)
	t.m.lookup.Observe(time.Since(start).Seconds())
	for _, r := range res {
		if err := r.Error(); err != nil && !valkey.IsValkeyNil(err) && !wrongType(err) {
			timedOut := errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded)
			// The client may report a deadline before the request's
			// context has ended: a deadline of the request's no later
			// than the timeout is the one that passed.
			own, has := asked.Deadline()
			limit, _ := ctx.Deadline()
			first := timedOut && has && !own.After(limit) // the request's own deadline passed first
			switch {
			case first && own.Sub(start) >= t.cfg.timeout/2:
				// But it left the tier at least half its timeout: a
				// tier slower than that is at fault, lest one slower
				// than every request's deadline be asked forever.
				t.m.timeouts.inc()
			case asked.Err() != nil, first:
				// The request went away, or its own deadline passed
				// first, too soon to tell the tier slow: the tier is
				// not at fault.
				t.m.skipped.inc()
				t.br.abandon()
				return nil
			case timedOut:
				t.m.timeouts.inc()
			default:
				t.m.errors.inc()
			}
			t.br.failure(time.Now(), err)
			return nil
		}
	}
	t.br.success()
	// The latest flush that covers the name, of every entry, of negative
	// ones and of expired ones.
	var flushed, negative, expired int64
	evicted := false // an epoch that every value of the name is written with is gone
	for i, r := range res[epochs:] {
		v, err := r.AsInt64()
		switch {
		case valkey.IsValkeyNil(err):
			evicted = true
			continue
		case err != nil:
			// An epoch that is not a time may hide a flush: it covers
			// every value of its scope until a write replaces it.
			t.m.rejected[errEpoch].inc()
			t.logRefused(errEpoch)
			t.foundBad(name, i, now)
			v = math.MaxInt64
		}
		switch i {
		case 1:
			negative = max(negative, v)
		case 2:
			expired = max(expired, v)
		default:
			flushed = max(flushed, v)
		}
	}
	var e entry.Entry
	for i, r := range res[:epochs] {
		v, err := r.AsBytes()
		switch {
		case valkey.IsValkeyNil(err):
			continue // not there
		case err != nil:
			err = errFormat // a key of another type than a string
		default:
			e, err = t.keys.open(tierKeys[i], keys[i], v)
		}
		if err == nil && evicted {
			// Its epochs were evicted, and with them maybe a flush that
			// covers it: no log line, as a full tier evicts all along.
			t.m.rejected[errEvicted].inc()
			continue
		}
		if err != nil {
			t.m.rejected[err].inc()
			t.logRefused(err)
			continue
		}
		stored := int64(e.Stored())
		switch {
		case now > e.Expires()+t.opt.Grace:
		case stored <= flushed, stored <= negative && flush.Negativity(e), e.Expires() <= expired:
		case accept(e):
			t.m.hits.inc()
			return notAhead(e, now)
		}
	}
	t.m.misses.inc()
	return nil
}

// notAhead returns e taken as stored no later than now, as a snapshot's
// entries are: stored by a replica whose clock is ahead of this one's, it
// would be served unaged, past its TTL by the difference.
func notAhead(e entry.Entry, now int64) entry.Entry {
	if int64(e.Stored()) <= now {
		return e
	}
	e = slices.Clone(e) // the client's reply, a string's bytes
	e.SetStored(uint32(now))
	return e
}

// foundBad notes that the i-th epoch a lookup of name reads was found at
// now not to be a time, for the next write to replace.
func (t *Tier) foundBad(name []byte, i int, now int64) {
	n := 0
	t.keys.epochs(name, func(key string) {
		if n == i {
			t.badMu.Lock()
			if t.bad == nil {
				t.bad = map[string]int64{}
			}
			if len(t.bad) < maxBatch {
				t.bad[key] = max(t.bad[key], now)
			}
			t.badMu.Unlock()
		}
		n++
	})
}

// wrongType reports whether err is the server's refusal to read a key of
// another type: what someone else wrote there, not a failure of the tier.
func wrongType(err error) bool {
	verr, ok := valkey.IsValkeyErr(err)
	return ok && strings.HasPrefix(verr.Error(), "WRONGTYPE")
}

// countLabels returns the labels of a wire name, the root's included.
func countLabels(name []byte) int {
	n := 1
	for off := 0; name[off] != 0; off += int(name[off]) + 1 {
		n++
	}
	return n
}

// logRefused says that a value or an epoch was refused, once a minute per
// reason.
func (t *Tier) logRefused(why error) {
	t.logMu.Lock()
	defer t.logMu.Unlock()
	now := time.Now()
	if now.Before(t.logNext[why.Error()]) {
		return
	}
	t.logNext[why.Error()] = now.Add(time.Minute)
	if why == errEpoch {
		log.Warningf("Shared tier %s: a flush's time that is not a number: the values it may cover are misses until a write replaces it", t.cfg)
		return
	}
	log.Warningf("Shared tier %s: a value refused (%s): not written by a block of these settings and secret; ignored", t.cfg, why)
}

// queued is an entry to write, and the generation of the tier's fence
// when it was queued.
type queued struct {
	e   entry.Entry
	gen uint64
}

// Put hands e, an entry the block stored, to the tier, which writes it in
// the background; when the queue is full it is dropped.
func (t *Tier) Put(e entry.Entry) {
	select {
	case t.queue <- queued{append([]byte(nil), e...), t.fence.Gen()}:
	default:
		t.m.dropped.inc()
	}
}

// writer writes the queued entries, a pipeline of up to maxBatch at a
// time, each to expire with its entry's serve_stale window.
func (t *Tier) writer() {
	defer t.wg.Done()
	batch := make([]queued, 0, maxBatch)
	for {
		select {
		case <-t.ctx.Done():
			return
		case e := <-t.queue:
			batch = append(batch[:0], e)
		}
	more:
		for len(batch) < maxBatch {
			select {
			case e := <-t.queue:
				batch = append(batch, e)
			default:
				break more
			}
		}
		t.write(batch)
	}
}

func (t *Tier) write(batch []queued) {
	cp := t.client.Load()
	if cp == nil {
		for range batch {
			t.m.dropped.inc()
		}
		return
	}
	c := *cp
	now := time.Now().Unix()
	values := make(valkey.Commands, 0, len(batch))
	witnesses := map[string]int64{}
	for _, q := range batch {
		e := q.e
		left := e.Expires() + t.opt.Grace - now
		if left <= 0 || t.fence.Covers(q.gen, e) {
			continue
		}
		key := t.keys.key(e.Key())
		values = append(values, c.B().Set().Key(key).Value(valkey.BinaryString(t.keys.seal(key, e))).Px(seconds(left)).Build().Pin())
		t.keys.witness(witnesses, e.QName(), int64(e.Stored())-1)
	}
	// The breaker is asked only for a batch that will report back: a
	// half-open breaker's probe taken and never reported would skip the
	// tier for good.
	if len(values) == 0 {
		return
	}
	// The epochs go first, so that a lookup seldom finds a value without
	// them (a miss; Cluster runs a pipeline's slots apart). One that
	// exists keeps its time, the last flush's, and lives on from now:
	// every value it covers expires before it. One that does not is
	// written with a time before the batch's values, so that after an
	// eviction it holds back the values of its scope stored earlier.
	life := t.epochLife()
	t.badMu.Lock()
	bad := t.bad
	t.bad = nil
	t.badMu.Unlock()
	cmds := make(valkey.Commands, 0, len(bad)+2*len(witnesses)+len(values))
	// An epoch that is not a time, which the epochs below would keep
	// alive and its scope a miss for good, is replaced by a time no
	// earlier than the lookup that found it and this write: a flush it
	// hides was made before it was found, so that the time covers every
	// value that flush did, as a flush made now would.
	for key, found := range bad {
		cmds = append(cmds, t.setEpoch(c, key, max(found, now)))
	}
	for key, at := range witnesses {
		cmds = append(cmds, c.B().Set().Key(key).Value(strconv.FormatInt(at, 10)).Nx().Px(life).Build().Pin(),
			c.B().Pexpire().Key(key).Milliseconds(life.Milliseconds()).Build().Pin())
	}
	cmds = append(cmds, values...)
	if !t.br.allow(time.Now()) {
		for range values {
			t.m.dropped.inc()
		}
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, writeTimeout)
	defer cancel()
	var failed error
	start := time.Now()
	for i, r := range c.DoMulti(ctx, cmds...) {
		err := r.Error()
		if valkey.IsValkeyNil(err) {
			err = nil // SET NX of an epoch that exists
		}
		switch {
		case err != nil:
			failed = err
			if i >= len(cmds)-len(values) {
				t.m.dropped.inc()
			}
		case i >= len(cmds)-len(values):
			t.m.written.inc()
		}
	}
	switch took := time.Since(start); {
	case failed != nil:
		t.br.failure(time.Now(), failed)
	case took > t.cfg.timeout:
		t.br.late(time.Now(), fmt.Errorf("writes took %v, lookups wait %v", took, t.cfg.timeout))
	default:
		t.br.success()
	}
}

// Flush applies f, made at now (the block's clock, unix seconds), to the
// tier: a value stored before it that it covers is a miss from now on, on
// every replica; and sends it to the other replicas, which apply it to
// their local stores.
func (t *Tier) Flush(f flush.Flush, now int64) error {
	t.fence.BeginFlush(f, now)
	cp := t.client.Load()
	if cp == nil {
		return fmt.Errorf("shared tier %s: not connected", t.cfg)
	}
	c := *cp
	epoch := func(scope epochScope, name []byte) valkey.Completed {
		return t.setEpoch(c, t.keys.epochKey(scope, name), now)
	}
	var cmds valkey.Commands
	switch f.Scope {
	case flush.Names:
		for _, n := range f.Names {
			cmds = append(cmds, epoch(epochName, n))
		}
	case flush.Zones:
		for _, z := range f.Names {
			cmds = append(cmds, epoch(epochZone, z))
		}
	case flush.Negative:
		cmds = append(cmds, epoch(epochNegative, nil))
	case flush.Expired:
		// Covers what had expired at now (flush.Covers): the stale
		// values serve_stale would still serve from the tier.
		cmds = append(cmds, epoch(epochExpired, nil))
	case flush.All:
		cmds = append(cmds, epoch(epochAll, nil))
	}
	msg := f.Marshal(nil)
	tag := t.keys.mac(forFlush, []byte(t.id), msg)
	ctx, cancel := context.WithTimeout(t.ctx, writeTimeout)
	defer cancel()
	// The flush goes to the stream only once its epochs are written: of a
	// Cluster they live on other nodes than the stream, which a pipeline
	// writes to at once, and a replica told of the flush before its epochs
	// landed could read again from the tier a value the flush covers.
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shared tier %s: %w", t.cfg, err)
		}
	}
	add := c.B().Xadd().Key(t.keys.streamKey()).Maxlen().Almost().Threshold(strconv.Itoa(maxStream)).Id("*").
		FieldValue().FieldValue("from", t.id).FieldValue("flush", valkey.BinaryString(msg)).FieldValue("tag", valkey.BinaryString(tag[:tagLen])).Build().Pin()
	if err := c.Do(ctx, add).Error(); err != nil {
		return fmt.Errorf("shared tier %s: %w", t.cfg, err)
	}
	t.m.sent.inc()
	return nil
}

// setEpoch is the command that writes at, a flush's time, under an
// epoch's key.
func (t *Tier) setEpoch(c valkey.Client, key string, at int64) valkey.Completed {
	return c.B().Set().Key(key).Value(strconv.FormatInt(at, 10)).Px(t.epochLife()).Build().Pin()
}

// epochLife is how long an epoch lives once written: past the expiry of
// any value written before, which lives at most MaxTTL and the serve_stale
// window.
func (t *Tier) epochLife() time.Duration {
	return seconds(t.opt.MaxTTL + t.opt.Grace + 1)
}

// seconds returns n seconds, or Go's longest duration when n is longer:
// serve_stale takes a window up to it, and a life counted from one would
// wrap to a negative PX, which the tier refuses.
func seconds(n int64) time.Duration {
	if n > int64(time.Duration(math.MaxInt64)/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Second
}

// readFlushes applies the flushes the other replicas send after the one
// whose ID is last (where it resumes when connecting), and after an error
// from where it left off.
func (t *Tier) readFlushes(last string, behind bool) {
	testHookReading()
	c := *t.client.Load()
	stream := t.keys.streamKey()
	wait := reconnectMin
	// behind: a read since the last check that found the stream whole
	// returned flushes, so that more may have come after them, unread, in
	// a stream that went before the next read. At the start, whether it
	// resumes before the stream's end.
	for ; t.ctx.Err() == nil; t.readUpTo(last) {
		res := c.Do(t.ctx, c.B().Xread().Count(100).Block(streamBlock.Milliseconds()).Streams().Key(stream).Id(last).Build().Pin())
		read, err := res.AsXRead()
		if err != nil && !valkey.IsValkeyNil(err) {
			if t.ctx.Err() != nil {
				return
			}
			wait = t.pause(wait)
			if next, _ := t.checkLost(c, stream, last, behind); next != last {
				last, behind = next, false
			}
			continue
		}
		wait = reconnectMin
		// A reader that fell behind without an error (a long walk of the
		// store, a stall) may find the flushes after last trimmed; one
		// that read nothing, the stream gone, which no read reports. The
		// flushes read from a stream gone since are covered by the whole
		// flush, and their IDs are no place to read the new one from.
		next, checked := t.checkLost(c, stream, last, behind)
		if next != last {
			last, behind = next, false
			continue
		}
		for _, m := range read[stream] {
			last = m.ID
			t.received(m.FieldValues)
		}
		if len(read[stream]) > 0 {
			behind = true
		} else if checked {
			behind = false
			testHookCaughtUp()
		}
	}
}

// readUpTo records that the reader applied the flushes up to last.
func (t *Tier) readUpTo(last string) {
	readers.Lock()
	t.read = last
	readers.Unlock()
}

// testHookReading runs as the reader of flushes starts: a test holds it
// there to show that a flush sent meanwhile is read all the same.
var testHookReading = func() {}

// testHookCaughtUp runs when a read of the stream found no flush unread.
var testHookCaughtUp = func() {}

// streamEnd returns the ID of the stream's last flush, "0-0" when it has
// none. A key of another type holds none: what someone else wrote there
// keeps no replica from connecting.
func (t *Tier) streamEnd(c valkey.Client, stream string) (string, error) {
	r, err := c.Do(t.ctx, c.B().Xrevrange().Key(stream).End("+").Start("-").Count(1).Build().Pin()).AsXRange()
	if err != nil && !valkey.IsValkeyNil(err) && !wrongType(err) {
		return "", err
	}
	if len(r) == 0 {
		return "0-0", nil
	}
	return r[0].ID, nil
}

// checkLost finds flushes after last that the stream lost, and returns
// where to read on. The stream lost them when it no longer holds the flush
// after last (trimmed), or holds neither last nor any flush after it:
// deleted (FLUSHALL, an eviction, a failover or restart to a server without
// it), maybe made again since (madeAgain). A replica behind the stream,
// which may not have read them, flushes its local store whole. A server
// that lost the stream may have lost the epochs of its flushes with it (a
// failover before they reached the replica that took over), so the tier is
// flushed whole too, by every replica that finds the stream gone: one that
// had read every flush keeps its store, so that a restart of a server
// without persistence leaves the replicas warm. A stream made again is read
// from its start. checked is false where the server did not answer.
func (t *Tier) checkLost(c valkey.Client, stream, last string, behind bool) (next string, checked bool) {
	if last == "0-0" {
		return last, true
	}
	end, err := t.streamEnd(c, stream)
	if err != nil {
		return last, false
	}
	if !idAfter(last, end, 0) {
		r, err := c.Do(t.ctx, c.B().Xrange().Key(stream).Start("-").End("+").Count(1).Build().Pin()).AsXRange()
		if err != nil {
			return last, false
		}
		if len(r) == 0 || !idAfter(r[0].ID, last, 1) {
			return last, true
		}
		if !t.madeAgain(c, stream) {
			t.lost("flushes were trimmed from the stream before it read them: the local store is flushed whole")
			return last, true
		}
	}
	if c.Do(t.ctx, t.setEpoch(c, t.keys.all, time.Now().Unix())).Error() != nil {
		return last, false // checked again after the next read
	}
	if behind {
		t.lost("the stream of flushes was deleted before it read them all: the tier and the local store are flushed whole")
	} else {
		log.Warningf("Shared tier %s: the stream of flushes was deleted after it read them all: the tier is flushed whole, the local store kept", t.cfg)
	}
	// An eviction may have taken it, or a failover or restart to a server
	// of other settings.
	t.warnEviction(c)
	return "0-0", true
}

// warnEviction warns when the server's maxmemory-policy may evict the
// stream of flushes: an allkeys one evicts it, which has no TTL, as it
// evicts the values, and each stream gone flushes the tier whole
// (checkLost); a volatile one evicts only keys with a TTL, which all the
// tier's other keys have. A server without maxmemory evicts nothing. A
// server that refuses CONFIG, as managed ones may, is no fault of the
// tier's. Of a Cluster every node is asked, each by its address: a command
// without a key reaches only one, and the stream lives on its slot's,
// which a failover may move to any. They are asked at once, so that one
// that does not answer costs the others nothing of the timeout.
func (t *Tier) warnEviction(c valkey.Client) {
	ctx, cancel := context.WithTimeout(t.ctx, writeTimeout)
	defer cancel()
	if c.Mode() != valkey.ClientModeCluster {
		t.warnNodeEviction(ctx, c, "")
		return
	}
	var wg sync.WaitGroup
	for addr, n := range c.Nodes() {
		wg.Go(func() { t.warnNodeEviction(ctx, n, "node "+addr+": ") })
	}
	wg.Wait()
}

// warnNodeEviction is warnEviction's for one server, named by node in the
// log.
func (t *Tier) warnNodeEviction(ctx context.Context, c valkey.Client, node string) {
	// One pattern, which servers before Redis 7 take too, for both.
	m, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory*").Build().Pin()).AsStrMap()
	if err != nil {
		log.Debugf("Shared tier %s: %smaxmemory-policy unknown: %v", t.cfg, node, err)
		return
	}
	if policy := m["maxmemory-policy"]; strings.HasPrefix(policy, "allkeys-") && m["maxmemory"] != "0" {
		log.Warningf("Shared tier %s: %smaxmemory-policy %s may evict the stream of flushes, and each eviction of it makes every replica flush the tier whole, and those behind it their stores too: volatile-lru or volatile-lfu keeps it, evicting only keys with a TTL (the tier's values and epochs)", t.cfg, node, policy)
	}
}

// madeAgain reports whether the stream, whose first flush is past the one
// after last, was made again since this replica read last rather than
// trimmed: it never lost a flush (XINFO STREAM's entries-added is its
// length), so it never held last. Its max-deleted-entry-id would not tell:
// trimming leaves it as it was. One made again and trimmed since, or a
// server that does not say (before Redis 7), is taken as trimmed.
func (t *Tier) madeAgain(c valkey.Client, stream string) bool {
	info, err := c.Do(t.ctx, c.B().XinfoStream().Key(stream).Build().Pin()).AsMap()
	if err != nil {
		return false
	}
	added, length := info["entries-added"], info["length"]
	a, aerr := added.AsInt64()
	n, nerr := length.AsInt64()
	return aerr == nil && nerr == nil && a == n
}

// lost flushes the local store whole for flushes lost before this replica
// read them, why.
func (t *Tier) lost(why string) {
	log.Warningf("Shared tier %s: %s", t.cfg, why)
	t.m.lost.inc()
	t.apply(flush.Flush{Scope: flush.All})
}

// idAfter reports whether stream ID a comes after b by more than gap IDs
// of b's millisecond: by any, for gap 0; past the ID after b, for 1.
func idAfter(a, b string, gap uint64) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	ams, _ := strconv.ParseUint(am, 10, 64)
	bms, _ := strconv.ParseUint(bm, 10, 64)
	asq, _ := strconv.ParseUint(as, 10, 64)
	bsq, _ := strconv.ParseUint(bs, 10, 64)
	return ams > bms || ams == bms && asq > bsq+gap
}

// pause waits wait, or until the tier closes, and returns the next wait.
func (t *Tier) pause(wait time.Duration) time.Duration {
	select {
	case <-t.ctx.Done():
	case <-time.After(wait):
	}
	return min(2*wait, reconnectMax)
}

// received applies one flush of the stream, unless this replica sent it or
// it fails its checks.
func (t *Tier) received(fields map[string]string) {
	from, msg, tag := fields["from"], fields["flush"], fields["tag"]
	if from == t.id {
		return
	}
	want := t.keys.mac(forFlush, []byte(from), []byte(msg))
	if len(tag) != tagLen || string(want[:tagLen]) != tag {
		t.m.rejected[errTag].inc()
		t.logRefused(errTag)
		return
	}
	f, err := flush.Unmarshal([]byte(msg))
	if err != nil {
		t.m.rejected[errFormat].inc()
		t.logRefused(errFormat)
		return
	}
	t.m.received.inc()
	t.apply(f)
}

// apply fences the queue off f, another replica's flush, and applies it
// to the local store.
func (t *Tier) apply(f flush.Flush) {
	t.fence.BeginFlush(f, time.Now().Unix())
	t.opt.Apply(f)
}

// Connected reports whether the tier has connected.
func (t *Tier) Connected() bool { return t.client.Load() != nil }

// Stats describes the tier for the admin stats.
func (t *Tier) Stats() *admin.Shared {
	st := &admin.Shared{URL: t.cfg.String(), Breaker: t.br.current().String()}
	t.m.stats(st)
	return st
}
