// Package deadletter publishes the messages the alerter cannot use on llm.invalid, with the
// subject they came on and why.
package deadletter
