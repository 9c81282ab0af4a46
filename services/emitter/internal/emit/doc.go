// Package emit validates request events, encodes them and hands them to the publisher
// without ever blocking the caller: the proxy, the ingest, bench and replay all emit
// through it, so every event on the bus passed the same checks.
package emit
