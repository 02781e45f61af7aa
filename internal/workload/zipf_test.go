package workload

import (
	"math"
	"testing"
)

// harmonic returns sum over k in [1, n] of k^-s: the first terms summed, the
// rest by the integral with the midpoint rule's correction (error below 1e-9).
func harmonic(n int, s float64) float64 {
	h := 0.0
	m := min(n, 1000)
	for k := 1; k <= m; k++ {
		h += math.Pow(float64(k), -s)
	}
	if n > m {
		a, b := float64(m)+0.5, float64(n)+0.5
		h += (math.Pow(b, 1-s) - math.Pow(a, 1-s)) / (1 - s)
	}
	return h
}

func TestZipfSkew(t *testing.T) {
	const draws = 1_000_000
	z := NewTrace()
	count := map[int]int{}
	top := 0 // draws among the most popular 1% of the names
	for i := range z.Trace(draws) {
		if i < 0 || i >= TraceNames {
			t.Fatalf("index %d outside [0, %d)", i, TraceNames)
		}
		if i < 10 {
			count[i]++
		}
		if i < TraceNames/100 {
			top++
		}
	}
	hn := harmonic(TraceNames, TraceSkew)
	for k := range 10 {
		want := math.Pow(float64(k+1), -TraceSkew) / hn
		got := float64(count[k]) / draws
		// 5 standard deviations of a binomial count.
		if tol := 5 * math.Sqrt(want/draws); math.Abs(got-want) > tol {
			t.Errorf("rank %d: frequency %.5f, want %.5f", k+1, got, want)
		}
	}
	want := harmonic(TraceNames/100, TraceSkew) / hn
	got := float64(top) / draws
	t.Logf("the top 1%% of names take %.3f of the queries (%.3f expected), rank 1 %.4f", got, want, float64(count[0])/draws)
	if math.Abs(got-want) > 0.005 {
		t.Errorf("top 1%% of the names take %.4f of the queries, want %.4f", got, want)
	}
}

func TestZipfDeterministic(t *testing.T) {
	a, b := NewTrace(), NewTrace()
	for range 10_000 {
		if a.Next() != b.Next() {
			t.Fatal("two traces differ")
		}
	}
}
