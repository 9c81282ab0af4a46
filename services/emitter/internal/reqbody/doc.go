// Package reqbody reads request bodies into memory under one budget that every body the
// process holds shares (EMITTER_MAX_PARSE_MEMORY): the proxy's, the ingest's and the OTLP
// receivers'. A body's buffer grows with what has arrived, so a client declaring a large
// body and sending little holds little, and a body that does not fit beside the others is
// refused rather than read; one that stops arriving is given up (ReadRequest).
package reqbody
