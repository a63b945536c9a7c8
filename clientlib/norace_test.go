//go:build !race

package clientlib_test

// raceEnabled: under the race detector sync.Pool drops what is put in it
// at random, so a pooled call is allocated again now and then.
const raceEnabled = false
