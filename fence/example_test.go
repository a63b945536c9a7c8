package fence_test

import (
	"fmt"
	"sync"

	"github.com/kunci/kunci/fence"
)

func ExampleGuard() {
	var g fence.Guard
	fmt.Println(g.Admit(7))        // the first token seen
	fmt.Println(g.Admit(9))        // a newer grant took over
	fmt.Println(g.Admit(7))        // the old holder woke up late
	fmt.Println(g.AdmitCurrent(9)) // the current holder writes again
	fmt.Println(g.Admit(9))        // ...but Admit takes each grant once
	fmt.Println(g.Last())
	// Output:
	// true
	// true
	// false
	// true
	// false
	// 9
}

// account is an in-memory resource. The check and the write are one
// critical section, so that a write admitted under an older token cannot
// land after a newer one.
type account struct {
	mu      sync.Mutex
	guard   fence.Guard
	balance int
}

func (a *account) setBalance(token uint64, balance int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.guard.AdmitCurrent(token) {
		return fmt.Errorf("set balance under token %d (last %d): %w", token, a.guard.Last(), fence.ErrStale)
	}
	a.balance = balance
	return nil
}

func ExampleGuard_resource() {
	var acct account
	fmt.Println(acct.setBalance(41, 100)) // holder A, token 41
	fmt.Println(acct.setBalance(42, 70))  // A's lease ran out; B got token 42
	fmt.Println(acct.setBalance(41, 150)) // A, paused until now, writes
	fmt.Println(acct.balance)
	// Output:
	// <nil>
	// <nil>
	// set balance under token 41 (last 42): fence: stale token
	// 70
}
