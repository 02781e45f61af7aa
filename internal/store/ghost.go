package store

// The ghost remembers the keys probation dropped, in buckets of ghostLanes
// marks packed in a word, the newest in the lowest lane. A mark is an 11-bit
// fingerprint of the key's hash and a state bit, ghostKnown when the key is
// remembered in full, clear when only tentatively; 0 is a free lane. A key
// dropped is pushed into its bucket's lowest lane and the oldest mark falls
// off the top: a mark lives until its bucket has taken ghostLanes more keys,
// so that the ghost forgets in the order it learnt, after about as many
// drops as it has marks, rather than at random as a mark that any other key
// may overwrite. A tentative mark takes the place of the oldest tentative or
// free one and never of a key remembered in full: a flood of large names
// asked once does not make the ghost forget the names asked again.
const (
	ghostLaneBits = 12
	ghostLanes    = 64 / ghostLaneBits
	ghostLane     = 1<<ghostLaneBits - 1
	ghostUsed     = 1<<(ghostLanes*ghostLaneBits) - 1 // the lanes of a word
	ghostKnown    = 1
)

// ghostMark returns the tentative mark of hash h: a fingerprint from bits
// that pick neither the shard (the lowest) nor the bucket (the highest),
// never 0.
func ghostMark(h uint64) uint64 {
	if m := h >> 16 & ghostLane &^ ghostKnown; m != 0 {
		return m
	}
	return ghostKnown + 1
}

// ghostWords is the words of the ghost of a shard of budget bytes: a byte
// for every ghostBytes.
func ghostWords(budget int64) int {
	return int(max(1, budget/ghostBytes/8))
}

func (sh *shard) ghostBucket(h uint64) *uint64 {
	return &sh.ghost[(h>>32)*uint64(len(sh.ghost))>>32]
}

// ghostFind returns the lane of w holding the tentative or known mark m, -1
// for none.
func ghostFind(w, m uint64) int {
	for k := range ghostLanes {
		if w>>(k*ghostLaneBits)&ghostLane&^ghostKnown == m {
			return k
		}
	}
	return -1
}

// ghostCut returns w with lane k taken out: the older lanes move down one,
// the oldest lane is free.
func ghostCut(w uint64, k int) uint64 {
	low := w & (1<<(k*ghostLaneBits) - 1)
	return low | w>>((k+1)*ghostLaneBits)<<(k*ghostLaneBits)
}

// ghostPush returns w with lane k taken out and m pushed in as the newest.
func ghostPush(w uint64, k int, m uint64) uint64 {
	return (ghostCut(w, k)<<ghostLaneBits | m) & ghostUsed
}

// ghostRoom returns the lane a mark m new to w takes: the oldest, or for a
// tentative one the oldest tentative or free lane, -1 when every lane holds
// a key remembered in full.
func ghostRoom(w, m uint64) int {
	for k := ghostLanes - 1; k >= 0; k-- {
		if m&ghostKnown != 0 || w>>(k*ghostLaneBits)&ghostKnown == 0 {
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
	}
	b, m := sh.ghostBucket(h), ghostMark(h)
	if size <= trustedSize || sh.toss()*uint64(size) < trustedSize<<16 {
		m |= ghostKnown
	}
	if k := ghostFind(*b, m&^ghostKnown); k >= 0 {
		*b = ghostPush(*b, k, m|*b>>(k*ghostLaneBits)&ghostKnown)
	} else if k = ghostRoom(*b, m); k >= 0 {
		*b = ghostPush(*b, k, m)
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

// recall reports whether the ghost remembers the key of hash h in full, and
// forgets it; a key remembered tentatively is remembered in full from now,
// its mark the newest, as the key was asked again.
func (sh *shard) recall(h uint64) bool {
	if sh.ghost == nil {
		return false
	}
	b, m := sh.ghostBucket(h), ghostMark(h)
	k := ghostFind(*b, m)
	if k < 0 {
		return false
	}
	if *b>>(k*ghostLaneBits)&ghostKnown != 0 {
		*b = ghostCut(*b, k)
		return true
	}
	*b = ghostPush(*b, k, m|ghostKnown)
	return false
}
