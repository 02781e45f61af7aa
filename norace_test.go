//go:build !race

package compactcache

const raceEnabled = false
