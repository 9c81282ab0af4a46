// Package lease keeps a single process counting for each AGG_CONSUMER. The replay floor
// and the ledger are keyed by that name: two processes of one name would each count every
// event, so the second waits until the first is gone.
//
// The lease is one key per AGG_CONSUMER in the JetStream key-value bucket AGGREGATOR_LEASE
// (Bucket). It is taken with a create-if-absent, renewed with a compare-and-set on its
// revision every fifth of the TTL, and deleted on a clean stop. It has no server-side
// expiry: a waiter reads the key every poll and takes it over, with a compare-and-set on the
// revision it saw, once that revision has stayed the same for the TTL by its own clock. Every
// renewal makes a new revision, so a takeover can only follow a holder that has not renewed
// for the TTL.
//
// Fencing: a holder stops writing two thirds of the TTL after sending its last renewal that
// JetStream acknowledged (Held ends), a third of the TTL before any waiter can take over;
// that third covers the write already sent when the lease ends, which the next holder waits
// for (it settles this consumer's running inserts before reading the ledger), as after a
// crash. A holder fenced so waits for the lease again; one whose last value is still there
// (no other process wrote since) takes it back by a compare-and-set on that revision a TTL
// after its last renewal, as late as a waiter could have, and counts again from the floor.
package lease
