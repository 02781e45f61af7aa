package store

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/compactcache/compactcache/internal/entry"
)

// ghostShard returns a shard of a one-shard store with its ghost made.
func ghostShard(t *testing.T) *shard {
	t.Helper()
	s, err := newStoreOn(1, MinCapacity, PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0]
	sh.ghost = make([]uint64, sh.ghostLen)
	return sh
}

// bucketMates returns n hashes of distinct fingerprints that share the
// bucket of hash 0.
func bucketMates(n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(2*i+2) << 16 // fingerprints 2, 4, 6...: bits 16 on, the state bit clear
	}
	return hs
}

// TestGhostRemembersInOrder: a bucket remembers the last ghostLanes keys
// dropped into it, oldest forgotten first; a recall forgets its key and
// frees a lane, so that the keys older than it are kept one drop longer; a
// key dropped again is the newest.
func TestGhostRemembersInOrder(t *testing.T) {
	sh := ghostShard(t)
	hs := bucketMates(ghostLanes + 3)
	for _, h := range hs {
		sh.remember(h, trustedSize)
	}
	recalled := func(i int) bool { return sh.recall(hs[i]) >= 0 }
	for i := range 3 {
		if recalled(i) {
			t.Errorf("key %d of %d dropped into a bucket of %d lanes recalled", i, len(hs), ghostLanes)
		}
	}
	last := len(hs) - 1
	if !recalled(last - 1) {
		t.Fatal("the last keys dropped into a bucket are not recalled")
	}
	if recalled(last - 1) {
		t.Fatal("a key recalled once is recalled again")
	}
	// ghostLanes-1 keys left, the oldest hs[3]: one more drop keeps it,
	// two forget it.
	sh.remember(hs[0], trustedSize)
	if !recalled(3) {
		t.Fatal("a recall's free lane did not keep the oldest key one drop longer")
	}
	sh.remember(hs[1], trustedSize)
	sh.remember(hs[4], trustedSize) // again: the newest, not a second mark
	sh.remember(hs[2], trustedSize)
	for _, i := range []int{0, 1, 2, 4, last} {
		if !recalled(i) {
			t.Errorf("key %d not recalled", i)
		}
	}
}

// TestGhostBucketLanes: a bucket is one FIFO across its words: a cut
// moves the older lanes down one, through the word boundary, and a push
// moves every lane up one and drops the oldest.
func TestGhostBucketLanes(t *testing.T) {
	fill := func() *ghostBucket {
		var b ghostBucket
		for k := range ghostLanes {
			b.set(k, uint64(2*k+2))
		}
		return &b
	}
	lanes := func(b *ghostBucket) []uint64 {
		var l []uint64
		for k := range ghostLanes {
			l = append(l, b.lane(k))
		}
		return l
	}
	for k := range ghostLanes {
		b := fill()
		b.cut(k)
		want := lanes(fill())
		want = append(append(want[:k:k], want[k+1:]...), 0)
		if got := lanes(b); !slices.Equal(got, want) {
			t.Errorf("cut(%d): lanes %v, want %v", k, got, want)
		}
		b = fill()
		b.push(k, 99)
		want = lanes(fill())
		want = append([]uint64{99}, append(want[:k:k], want[k+1:]...)...)
		if got := lanes(b); !slices.Equal(got, want) {
			t.Errorf("push(%d): lanes %v, want %v", k, got, want)
		}
		if b[0]&^ghostUsed != 0 || b[ghostBucketWords-1]&^ghostUsed != 0 {
			t.Errorf("push(%d) set bits outside the lanes: %#x", k, b)
		}
	}
}

// TestGhostTentative: a large entry's key is remembered tentatively unless
// the coin trusts it: asked again it is not recalled, and dropped again it
// is. Tentative marks take the place of tentative or free ones only, and
// move no other mark.
func TestGhostTentative(t *testing.T) {
	sh := ghostShard(t)
	hs := bucketMates(2 * ghostLanes)
	large := entry.MaxLen
	tentative := 0
	for _, h := range hs[:ghostLanes] {
		sh.remember(h, large)
		if sh.recall(h) < 0 { // asked again: remembered in full from now
			tentative++
			sh.remember(h, large) // dropped again
			if sh.recall(h) < 0 {
				t.Fatal("a tentative key asked again, then dropped again, is not recalled")
			}
		}
	}
	if tentative < ghostLanes-1 {
		t.Errorf("%d of %d keys of %d-byte entries remembered tentatively", tentative, ghostLanes, large)
	}

	// A bucket of keys remembered in full keeps them through a flood of
	// large entries' keys, of a size the coin trusts once in 65,536 draws.
	for _, h := range hs[:ghostLanes] {
		sh.remember(h, trustedSize)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 300 {
		sh.remember(hs[ghostLanes+rng.IntN(ghostLanes)], 1<<47)
	}
	for i, h := range hs[:ghostLanes] {
		if sh.recall(h) < 0 {
			t.Errorf("key %d, remembered in full, forgotten in a flood of tentative ones", i)
		}
	}

	// Tentative marks move no other: keys remembered in full between
	// them last as many drops of such keys as without them, and the
	// tentative marks go first.
	for i, h := range hs[:ghostLanes] {
		sh.remember(h, trustedSize)
		for j := range 3 {
			sh.remember(hs[ghostLanes+(3*i+j)%ghostLanes], 1<<47)
		}
	}
	for i, h := range hs[:ghostLanes] {
		if sh.recall(h) < 0 {
			t.Errorf("key %d, remembered in full between tentative ones, forgotten", i)
		}
	}
}

// TestGhostFalseRecalls fills a ghost with random keys: it recalls the most
// recent of them, and of others asked, a share near ghostLanes in the 2^11
// fingerprints of a bucket.
func TestGhostFalseRecalls(t *testing.T) {
	sh := ghostShard(t)
	rng := rand.New(rand.NewPCG(7, 8))
	marks := sh.ghostLen * ghostLanes
	var kept []uint64
	for i := range 4 * marks {
		h := rng.Uint64()
		sh.remember(h, trustedSize)
		if i >= 4*marks-marks/4 {
			kept = append(kept, h)
		}
	}
	recalled := 0
	for _, h := range kept {
		if sh.recall(h) >= 0 {
			recalled++
		}
	}
	// The last quarter of the marks' worth of drops: a bucket took about
	// ghostLanes/4 of them, and kept all but the few that took ghostLanes.
	if recalled < len(kept)*95/100 {
		t.Errorf("%d of the last %d keys dropped recalled, want 95%%", recalled, len(kept))
	}
	const asks = 200_000
	falses := 0
	for range asks {
		if sh.recall(rng.Uint64()) >= 0 {
			falses++
		}
	}
	// Every lane full, a key matches one of ghostLanes fingerprints in
	// 2^11 with a chance of about ghostLanes/2048.
	if rate, most := float64(falses)/asks, 1.5*ghostLanes/2048.0; rate > most || falses == 0 {
		t.Errorf("%d false recalls in %d asks (%.5f), want some and at most %.5f", falses, asks, rate, most)
	}
}

// TestGhostRecallAge: a recall tells the lane of the key's mark, its age in
// pushes into its bucket, and the ghost's clock ticks at every push, not at
// a tentative mark set in place nor at a recall that forgets a mark.
func TestGhostRecallAge(t *testing.T) {
	sh := ghostShard(t)
	hs := bucketMates(ghostLanes + 2)
	for _, h := range hs[:ghostLanes] {
		sh.remember(h, trustedSize)
	}
	if got := sh.ghostClock; got != ghostLanes {
		t.Errorf("the clock ticked %d times for %d marks pushed", got, ghostLanes)
	}
	// The oldest first: a recall frees its lane, moving no younger mark.
	for i, h := range hs[:ghostLanes] {
		if age := sh.recall(h); age != ghostLanes-1-i {
			t.Errorf("key %d of %d recalled at age %d, want %d", i, ghostLanes, age, ghostLanes-1-i)
		}
	}
	if got := sh.ghostClock; got != ghostLanes {
		t.Errorf("recalls moved the clock to %d, want %d", got, ghostLanes)
	}
	if age := sh.recall(hs[0]); age != -1 {
		t.Errorf("a key recalled already recalled at age %d, want -1", age)
	}

	// Newest first: each recall leaves the next at lane 0.
	for _, h := range hs[:3] {
		sh.remember(h, trustedSize)
	}
	for i := 2; i >= 0; i-- {
		if age := sh.recall(hs[i]); age != 0 {
			t.Errorf("the newest key recalled at age %d, want 0", age)
		}
	}

	// A tentative mark: no tick when set, -1 and a tick when asked again
	// (pushed in full), then recalled at its age.
	large := 1 << 47 // trusted once in 65,536 draws
	before := sh.ghostClock
	sh.remember(hs[ghostLanes], large)
	if got := sh.ghostClock; got != before {
		t.Errorf("a tentative mark moved the clock by %d", got-before)
	}
	if age := sh.recall(hs[ghostLanes]); age != -1 {
		t.Errorf("a key remembered tentatively recalled at age %d, want -1", age)
	}
	if got := sh.ghostClock; got != before+1 {
		t.Errorf("a tentative mark pushed in full moved the clock by %d, want 1", got-before)
	}
	sh.remember(hs[ghostLanes+1], trustedSize)
	if age := sh.recall(hs[ghostLanes]); age != 1 {
		t.Errorf("a key remembered in full on its second ask recalled at age %d, want 1", age)
	}
}
