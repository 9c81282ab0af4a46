// Package ingest is the HTTP door for anything that cannot speak NATS: POST /v1/events takes
// one request event, a JSON array of them, or NDJSON, validates each, publishes the valid
// ones and answers with the accepted count and the errors per item.
package ingest
