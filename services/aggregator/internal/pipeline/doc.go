// Package pipeline runs one stream through its windows into ClickHouse with an
// exactly-once effect: it reads an ordered JetStream consumer (stream order, no gap,
// whatever happens to the connection), writes closed windows (and the request events) in one
// batch per table per flush, publishes the rollups, and only then saves its replay floor —
// the stream position before the oldest one a window still holds — in the key-value bucket
// AGGREGATOR (see FloorBucket). The consumer acknowledges nothing.
//
// Exactly once: every row records its consumer and seq_through, the last stream position
// consumed when the flush was cut; every event of that window up to seq_through is in that
// row or an earlier one, which holds because delivery has no gap. At start delivery begins
// again after the floor, so everything not yet stored comes again in order, and the ledger
// read back from ClickHouse tells which of those events are already in rows: they are
// skipped. The raw requests' ledger is the list of stored positions itself. A crash at any
// point — before an insert, between insert and floor, while saving it — therefore changes no
// total. An insert whose outcome is unknown is settled by counting the flush's rows before
// retrying.
//
// Invalid messages are dead-lettered on llm.invalid with their reason and counted; the floor
// moves past them like past any other message.
package pipeline
