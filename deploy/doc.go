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
//	GOMEMLIMIT = budget * 5/4 + 64MiB, rounded up to a MiB
//	limit      = GOMEMLIMIT + 96MiB   (the container's memory limit and request)
//
// GOMEMLIMIT bounds the memory the Go runtime holds: the stores (which never
// exceed their budgets), a quarter more for the garbage collector to work in,
// and CoreDNS's own heap. The container also holds what the Go runtime does
// not count, mostly the binary's pages (about 75MiB resident for this build
// of every CoreDNS plugin).
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

// GoMemLimit returns GOMEMLIMIT for a total byte budget.
func GoMemLimit(budget int64) int64 {
	return ceilMiB((budget*5+3)/4) + GoBase
}

// MemoryLimit returns the container's memory limit for a total byte budget.
func MemoryLimit(budget int64) int64 {
	return GoMemLimit(budget) + NonGo
}

func ceilMiB(n int64) int64 { return (n + mib - 1) / mib * mib }
