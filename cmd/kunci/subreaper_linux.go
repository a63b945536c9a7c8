package main

import "golang.org/x/sys/unix"

// becomeSubreaper makes kunci the parent of its command's orphans, so that
// kunci run can wait until every process of a killed group is gone.
func becomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}
