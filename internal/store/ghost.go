package store

// The ghost remembers the keys probation dropped, in buckets of ghostLanes
// marks packed in ghostBucketWords words, the newest in the lowest lane of
// the first word: a bucket is one FIFO across its words. A mark is an 11-bit
// fingerprint of the key's hash and a state bit, ghostKnown when the key is
// remembered in full, clear when only tentatively; 0 is a free lane.
//
// A key remembered in full is pushed into its bucket's lowest lane, every
// mark moving up one, and the oldest falls off the top: such a mark lives
// until its bucket has taken ghostLanes more, so that the ghost forgets in
// the order it learnt, after about as many drops as it has marks. A bucket
// of many lanes makes that lifetime the sharper: a scan of the same names,
// coming back after a fixed number of drops, is forgotten or remembered as
// a whole rather than in part.
//
// The ghost's clock ticks at every push: a mark's lane is its age in
// pushes into its bucket, about one in every bucket count of the clock's
// ticks (evict.go compares it with main's round).
//
// A tentative mark takes the place of the oldest tentative or free one,
// where it is, and never that of a key remembered in full; it moves no
// other mark. So a flood of large names asked once neither makes the ghost
// forget the keys remembered in full sooner nor keeps its own marks long:
// the next keys remembered in full push them off the top.
const (
	ghostLaneBits    = 12
	ghostPerWord     = 64 / ghostLaneBits
	ghostBucketWords = 2
	ghostLanes       = ghostPerWord * ghostBucketWords
	ghostLane        = 1<<ghostLaneBits - 1
	ghostUsed        = 1<<(ghostPerWord*ghostLaneBits) - 1 // the lanes of a word
	ghostTop         = (ghostPerWord - 1) * ghostLaneBits  // the shift of a word's oldest lane
	ghostKnown       = 1
)

// ghostBucket is a bucket of marks.
type ghostBucket [ghostBucketWords]uint64

// ghostMark returns the tentative mark of hash h: a fingerprint from bits
// that pick neither the shard (the lowest) nor the bucket (the highest),
// never 0.
func ghostMark(h uint64) uint64 {
	if m := h >> 16 & ghostLane &^ ghostKnown; m != 0 {
		return m
	}
	return ghostKnown + 1
}

// ghostWords is the words of the ghost of a shard of budget bytes: whole
// buckets, a byte for every ghostBytes.
func ghostWords(budget int64) int {
	return int(max(1, budget/ghostBytes/(8*ghostBucketWords))) * ghostBucketWords
}

func (sh *shard) ghostBucket(h uint64) *ghostBucket { return ghostBucketOf(sh.ghost, h) }

// ghostBucketOf returns the bucket of ghost that h's mark goes in.
func ghostBucketOf(ghost []uint64, h uint64) *ghostBucket {
	n := uint64(len(ghost) / ghostBucketWords)
	return (*ghostBucket)(ghost[(h>>32)*n>>32*ghostBucketWords:])
}

// lane returns lane k of b.
func (b *ghostBucket) lane(k int) uint64 {
	return b[k/ghostPerWord] >> (k % ghostPerWord * ghostLaneBits) & ghostLane
}

// set makes lane k of b hold m, the other lanes as they were.
func (b *ghostBucket) set(k int, m uint64) {
	s := k % ghostPerWord * ghostLaneBits
	b[k/ghostPerWord] = b[k/ghostPerWord]&^(ghostLane<<s) | m<<s
}

// find returns the lane of b holding the tentative or known mark m, -1 for
// none.
func (b *ghostBucket) find(m uint64) int {
	for k := range ghostLanes {
		if b.lane(k)&^ghostKnown == m {
			return k
		}
	}
	return -1
}

// cut takes lane k out of b: the older lanes move down one, the oldest lane
// is free.
func (b *ghostBucket) cut(k int) {
	w, s := k/ghostPerWord, k%ghostPerWord*ghostLaneBits
	b[w] = b[w]&(1<<s-1) | b[w]>>(s+ghostLaneBits)<<s
	for ; w+1 < ghostBucketWords; w++ {
		b[w] |= b[w+1] & ghostLane << ghostTop
		b[w+1] >>= ghostLaneBits
	}
}

// push takes lane k out of b and pushes m in as the newest.
func (b *ghostBucket) push(k int, m uint64) {
	b.cut(k)
	for w := ghostBucketWords - 1; w > 0; w-- {
		b[w] = (b[w]<<ghostLaneBits | b[w-1]>>ghostTop) & ghostUsed
	}
	b[0] = (b[0]<<ghostLaneBits | m) & ghostUsed
}

// tentativeRoom returns the lane a tentative mark new to b takes: the
// oldest tentative or free one, -1 when every lane holds a key remembered
// in full.
func (b *ghostBucket) tentativeRoom() int {
	for k := ghostLanes - 1; k >= 0; k-- {
		if b.lane(k)&ghostKnown == 0 {
			return k
		}
	}
	return -1
}

// remember keeps the key of hash h, whose entry of size bytes probation
// dropped, in the ghost: in full when the entry is small, the coin says so
// or the ghost remembered it in full already, tentatively otherwise. A key
// the ghost has a mark of moves to the newest lane.
func (sh *shard) remember(h uint64, size int) {
	if sh.ghost == nil {
		sh.ghost = make([]uint64, sh.ghostLen)
		sh.publish()
	}
	b, m := sh.ghostBucket(h), ghostMark(h)
	if size <= trustedSize || sh.toss()*uint64(size) < trustedSize<<16 {
		m |= ghostKnown
	}
	switch k := b.find(m &^ ghostKnown); {
	case k >= 0:
		b.push(k, m|b.lane(k)&ghostKnown)
		sh.tick()
	case m&ghostKnown != 0:
		b.push(ghostLanes-1, m)
		sh.tick()
	default:
		if k = b.tentativeRoom(); k >= 0 {
			b.set(k, m)
		}
	}
}

// toss returns a number in [0, 65536) from the shard's xorshift generator:
// its draws repeat from run to run, as the rest of the policy does.
func (sh *shard) toss() uint64 {
	sh.coin ^= sh.coin << 13
	sh.coin ^= sh.coin >> 7
	sh.coin ^= sh.coin << 17
	return sh.coin >> 48
}

// recall returns the age of the key of hash h in the ghost, the lane of its
// mark, and forgets it; -1 when the ghost does not remember it in full, and
// a key remembered tentatively is remembered in full from now, its mark the
// newest, as the key was asked again. A bucket takes about one mark in every
// len(ghost)/ghostBucketWords the ghost pushes, so that a mark in lane k has
// been in the ghost about k times that many ticks of its clock.
func (sh *shard) recall(h uint64) int {
	if sh.ghost == nil {
		return -1
	}
	b, m := sh.ghostBucket(h), ghostMark(h)
	k := b.find(m)
	if k < 0 {
		return -1
	}
	if b.lane(k)&ghostKnown != 0 {
		b.cut(k)
		return k
	}
	b.push(k, m|ghostKnown)
	sh.tick()
	return -1
}
