//go:build !linux

package main

// readNs is measured on Linux only, where the store maps its memory in huge
// pages; 0 elsewhere.
func readNs(size int64) float64 { return 0 }

// pageWrites is measured on Linux only; zero elsewhere.
func pageWrites() pageCosts { return pageCosts{} }
