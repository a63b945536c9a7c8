//go:build !linux

package main

import "errors"

// becomeSubreaper is Linux only: elsewhere orphans of the command go to
// init, and kunci run waits for the group only while it can see it.
func becomeSubreaper() error {
	return errors.New("not supported on this system")
}
