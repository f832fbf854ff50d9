package spill

import "encoding/base64"

// This file names where a bucket's spills are stored: the JetStream object
// store's layout, spelled here once for the spill package, the processor,
// the CLI and the bench.
//
// A bucket B is the stream OBJ_B. An object's chunks are messages on
// $O.B.C.<nuid>, the nuid being the one its info names; its info is the
// last message on $O.B.M.<the object's name in URL-safe base64>.

// StreamName is the stream that holds bucket's objects.
func StreamName(bucket string) string { return "OBJ_" + bucket }

// Subjects is the wildcard of every subject of bucket's stream.
func Subjects(bucket string) string { return "$O." + bucket + ".>" }

// ChunkPrefix is the start of every chunk subject of bucket.
func ChunkPrefix(bucket string) string { return "$O." + bucket + ".C." }

// ChunkSubject is the subject of the chunks of the object of bucket whose
// info names nuid.
func ChunkSubject(bucket, nuid string) string { return ChunkPrefix(bucket) + nuid }

// MetaSubject is the subject of the info of object name in bucket.
func MetaSubject(bucket, name string) string {
	return "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
}
