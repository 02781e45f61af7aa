//go:build race

package frontend

// raceEnabled: allocation counts mean nothing under the race detector.
const raceEnabled = true
