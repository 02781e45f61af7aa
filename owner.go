package compactcache

import "bytes"

// Most records of a response are owned by the question's name. Such a record
// stores no owner at all (recOwnerIsQname), and the reply writes its owner as
// a pointer to the question echoed at offset 12, so the owner takes the case
// the client used (RFC 1035 4.1.4 compression, DNS 0x20 intact).

// qnamePointer is a compression pointer to the question's name, which always
// starts right after the 12-byte header.
var qnamePointer = [2]byte{0xC0, headerSize}

// equalFoldWire reports whether two uncompressed wire names are equal,
// ignoring ASCII case as DNS does (RFC 4343).
func equalFoldWire(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	if bytes.Equal(a, b) {
		return true // most names come in one case: compared at memory speed
	}
	for i := range a {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if isUpper(c) {
		return c + toLower
	}
	return c
}

const toLower = 'a' - 'A'

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

// lowerInPlace lowers the ASCII capitals of b. Most names have none: it
// writes only where one is, half the time of building a lowered copy a
// byte at a time.
func lowerInPlace(b []byte) {
	for i, c := range b {
		if isUpper(c) {
			b[i] = c + toLower
		}
	}
}

// appendOwner writes a record's owner: the pointer to the question when the
// entry elided it (owner is nil), else the stored name, compressed against
// the message.
func (w *replyWriter) appendOwner(msg, owner []byte) []byte {
	if owner == nil {
		return append(msg, qnamePointer[:]...)
	}
	return w.appendName(msg, owner)
}
