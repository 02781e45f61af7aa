package workload

import (
	"iter"
	"math"
)

// The zipf trace of the workload: 10M names, popularity Zipf(0.9).
const (
	TraceNames = 10_000_000
	TraceSkew  = 0.9
	traceSeed  = 1
)

// Zipf draws entry indices in [0, n), index k-1 with probability proportional
// to 1/k^s, so that low indices are the popular names. It uses
// rejection-inversion (Hörmann and Derflinger, "Rejection-inversion to
// generate variates from monotone discrete distributions", 1996), as Apache
// Commons' RejectionInversionZipfSampler does: O(1) memory and about one
// uniform draw per sample for any s > 0. math/rand.Zipf uses the same method
// but accepts only s > 1, and an inverse-CDF table over 10M names would take
// 80 MB.
type Zipf struct {
	n      float64
	s      float64
	hX1    float64 // hIntegral(1.5) - 1
	hN     float64 // hIntegral(n + 0.5)
	shortc float64 // accept without the second test when k - x <= shortc
	r      rng
}

// NewZipf returns a sampler over n indices with exponent s, its stream
// fixed by seed.
func NewZipf(n int, s float64, seed int) *Zipf {
	z := &Zipf{n: float64(n), s: s, r: newRNG(domainSample, seed)}
	z.hX1 = z.hIntegral(1.5) - 1
	z.hN = z.hIntegral(z.n + 0.5)
	z.shortc = 2 - z.hIntegralInverse(z.hIntegral(2.5)-z.h(2))
	return z
}

// NewTrace returns the workload's zipf trace: TraceNames names, TraceSkew.
func NewTrace() *Zipf { return NewZipf(TraceNames, TraceSkew, traceSeed) }

// Next returns the next index of the trace.
func (z *Zipf) Next() int {
	for {
		u := z.hN + z.r.float()*(z.hX1-z.hN)
		x := z.hIntegralInverse(u)
		k := math.Floor(x + 0.5)
		k = min(max(k, 1), z.n)
		if k-x <= z.shortc || u >= z.hIntegral(k+0.5)-z.h(k) {
			return int(k) - 1
		}
	}
}

// Trace yields the next length indices; a second call continues the stream.
func (z *Zipf) Trace(length int) iter.Seq[int] {
	return func(yield func(int) bool) {
		for range length {
			if !yield(z.Next()) {
				return
			}
		}
	}
}

// h is the density, x^-s.
func (z *Zipf) h(x float64) float64 { return math.Exp(-z.s * math.Log(x)) }

// hIntegral is an antiderivative of h: (x^(1-s) - 1) / (1-s), written so
// that it stays exact near s = 1.
func (z *Zipf) hIntegral(x float64) float64 {
	lx := math.Log(x)
	return expm1Over((1-z.s)*lx) * lx
}

func (z *Zipf) hIntegralInverse(x float64) float64 {
	t := max(x*(1-z.s), -1)
	return math.Exp(log1pOver(t) * x)
}

// log1pOver returns log(1+x)/x, continuous at 0.
func log1pOver(x float64) float64 {
	if math.Abs(x) > 1e-8 {
		return math.Log1p(x) / x
	}
	return 1 - x*(0.5-x*(1.0/3-0.25*x))
}

// expm1Over returns (e^x - 1)/x, continuous at 0.
func expm1Over(x float64) float64 {
	if math.Abs(x) > 1e-8 {
		return math.Expm1(x) / x
	}
	return 1 + x*0.5*(1+x/3*(1+0.25*x))
}
