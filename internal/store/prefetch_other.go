//go:build !amd64 && !arm64

package store

func prefetch(addr uintptr) {}
