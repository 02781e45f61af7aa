// Package deploy holds the deployment of the compactcache CoreDNS build as
// Kubernetes cluster DNS and the tests that keep it honest: the image recipes
// (Dockerfile, ociimage/), the manifests (kubernetes/), the dashboard
// (grafana/) and the alert rules (prometheus/). See README.md beside this
// file. The package has no code of its own; its tests check that every
// manifest decodes strictly into the Kubernetes API types, that the Corefiles
// in them start with the custom build, that memory limits follow the sizing
// formula of the byte budgets, and that the dashboard and alerts name only
// metrics the plugin exports.
package deploy

// The sizing formula of README.md ("Sizing"), in bytes, for a Corefile whose
// compactcache blocks have byte budgets adding up to budget:
//
//	limit      = budget * 5/4 + 64MiB + 96MiB, rounded up to a MiB
//	             (the container's memory limit and request)
//	GOMEMLIMIT = limit - budget - 96MiB = budget/4 + 64MiB, the budget
//	             rounded up to a MiB
//
// The stores never exceed their budgets, and on Linux they map that memory
// outside the Go heap (arena_mmap.go), where GOMEMLIMIT does not count it.
// So GOMEMLIMIT bounds the rest of the Go runtime's memory: CoreDNS's own
// heap, and a quarter of the budget more for the garbage of the misses that
// fill it. The container also holds what the Go runtime does not count,
// mostly the binary's pages (about 75MiB resident for this build of every
// CoreDNS plugin).
const (
	mib = 1 << 20
	// GoBase is CoreDNS's heap besides the caches: the runtime, goroutines,
	// the kubernetes plugin's watch caches, forward's connections.
	GoBase = 64 * mib
	// NonGo is what the container holds outside the Go runtime's count: the
	// binary's resident pages (about 75MiB measured), socket buffers, the
	// rest of the process.
	NonGo = 96 * mib
)

// MemoryLimit returns the container's memory limit for a total byte budget.
func MemoryLimit(budget int64) int64 {
	return ceilMiB((budget*5+3)/4) + GoBase + NonGo
}

// GoMemLimit returns GOMEMLIMIT for a total byte budget: what the limit
// leaves after the stores, which are outside the Go heap, and NonGo.
func GoMemLimit(budget int64) int64 {
	return MemoryLimit(budget) - ceilMiB(budget) - NonGo
}

func ceilMiB(n int64) int64 { return (n + mib - 1) / mib * mib }
