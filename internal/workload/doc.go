// Package workload generates the reference workload of ../shared/WORKLOAD.md:
// the entries every memory and speed figure of compactcache is quoted on.
//
// Entry i is rebuilt from i alone: its question, its records and every
// variant's additions are drawn from splitmix64 generators seeded with i, so a
// benchmark holds no table of entries on the heap while it measures a cache.
// Entry i answers one question, class IN: qtype A (56%), AAAA (25%) or TXT
// (19%), with 1 to 4 records of that type owned by the qname, TTL 3600; a TXT
// record holds 64 to 224 bytes of rdata. The qname is a label of 6 to 20
// lowercase letters under one of 5,000 second-level domains (a label of 5 to
// 12 letters under com, net or org).
package workload
