package compactcache

import "github.com/compactcache/compactcache/internal/dnsmsg"

// Most records of a response are owned by the question's name. Such a record
// stores no owner at all (entry.RecOwnerIsQname), and the reply writes its owner as
// a pointer to the question echoed at offset 12, so the owner takes the case
// the client used (RFC 1035 4.1.4 compression, DNS 0x20 intact).

// qnamePointer is a compression pointer to the question's name, which always
// starts right after the 12-byte header.
var qnamePointer = [2]byte{0xC0, dnsmsg.HeaderLen}

// appendOwner writes a record's owner: the pointer to the question when the
// entry elided it (owner is nil), else the stored name, compressed against
// the message.
func (w *replyWriter) appendOwner(msg, owner []byte) []byte {
	if owner == nil {
		return append(msg, qnamePointer[:]...)
	}
	return w.AppendName(msg, owner)
}
