// Package subject picks the subject each request event is published on, llm.req.<env>.<scene>,
// and keeps the distinct subjects bounded: nats-server holds state for every subject its
// stream has messages on, for as long as it keeps them, so labels a client makes up per
// request must not become subjects. The exact labels travel in the payload, which is what
// the aggregator keys on; subjects only route.
package subject
