// Package lifecycle turns each window's rule results into alert state changes the way
// Prometheus does: inactive → pending on a breach, pending → firing after For consecutive
// breaching windows, firing → resolved after KeepFiringFor consecutive normal windows. A
// firing alert is sent once, re-sent every Resend, and resolved once; its fingerprint is a
// hash of its sorted labels, so the same alert keeps its identity across restarts.
package lifecycle
