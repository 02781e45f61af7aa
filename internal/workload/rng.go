package workload

// rng is splitmix64: one word of state, so entry i's generator is rebuilt
// from i alone, and every stream is the same on every machine and Go release
// (math/rand/v2's generators make no such promise across versions).
type rng struct{ s uint64 }

// Each stream of the workload has its own domain, so that adding a variant
// never shifts the draws of the reference entries.
const (
	domainEntry  uint64 = 0x6f1d5c8a2b3e4d71
	domainSLD    uint64 = 0x0d54a1f9c3e27b86
	domainCNAME  uint64 = 0xa7c3e9015b2d4f68
	domainSig    uint64 = 0x3b8e6d2f91c4a057
	domainSample uint64 = 0xe21f7b4c08d69a35
)

func newRNG(domain uint64, i int) rng {
	r := rng{s: domain ^ uint64(i)*0xd1342543de82ef95}
	r.next() // one round so that neighbouring i start far apart
	return r
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n) by multiply-shift: the bias, under 2^-32,
// does not matter to a workload.
func (r *rng) intn(n int) int { return int((r.next() >> 32) * uint64(n) >> 32) }

// float returns a number in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// letters appends n random lowercase letters.
func (r *rng) letters(b []byte, n int) []byte {
	for range n {
		b = append(b, byte('a'+r.intn(26)))
	}
	return b
}
