package tlsterm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testcert"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testcert.NewCA(t, "test CA")
	caFile := ca.Write(t, dir, "ca")
	cert, key := ca.Issue(t, "node", testcert.Options{}).Write(t, dir, "node")
	expiredCert, expiredKey := ca.Issue(t, "old", testcert.Options{NotAfter: time.Now().Add(-time.Minute)}).Write(t, dir, "old")
	noPEM := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(noPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	f, err := Load(Paths{Cert: cert, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if f.Cert.Leaf == nil || f.Server.ClientAuth != tls.NoClientCert || f.PeerRoots != nil {
		t.Errorf("server-only files: leaf %v, client auth %v, peer roots %v", f.Cert.Leaf != nil, f.Server.ClientAuth, f.PeerRoots)
	}
	f, err = Load(Paths{Cert: cert, Key: key, ClientCA: caFile, PeerTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	if f.Server.ClientAuth != tls.RequireAndVerifyClientCert || f.Server.ClientCAs == nil || f.PeerRoots == nil {
		t.Error("with a client CA and peer TLS: clients must be verified, and peers against the client CA")
	}
	for _, tc := range []struct {
		p    Paths
		want string
	}{
		{Paths{Cert: cert, Key: cert}, "TLS certificate " + cert + " with key " + cert},
		{Paths{Cert: expiredCert, Key: expiredKey}, "TLS certificate " + expiredCert + " expired on"},
		{Paths{Cert: cert, Key: key, ClientCA: noPEM}, "TLS CA file " + noPEM + " holds no PEM certificate"},
		{Paths{Cert: cert, Key: key, ClientCA: noPEM + ".missing"}, "TLS CA file"},
		{Paths{Cert: cert, Key: key, PeerTLS: true, PeerCA: noPEM}, "holds no PEM certificate"},
	} {
		if _, err := Load(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.p, err, tc.want)
		}
	}
}

func TestIdentity(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "test CA")
	for _, tc := range []struct {
		cn   string
		o    testcert.Options
		want string
	}{
		{"billing", testcert.Options{DNS: []string{"b.example"}}, "billing"},
		{"", testcert.Options{DNS: []string{"b.example"}}, "localhost"},
		{"", testcert.Options{URIs: []string{"spiffe://x/billing"}}, "localhost"},
	} {
		c := ca.Issue(t, tc.cn, tc.o)
		st := tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.Cert}, VerifiedChains: [][]*x509.Certificate{{c.Cert, ca.Cert}}}
		if got := Identity(&st); got != tc.want {
			t.Errorf("cn %q %+v: %q, want %q", tc.cn, tc.o, got, tc.want)
		}
		st.VerifiedChains = nil
		if got := Identity(&st); got != "" {
			t.Errorf("an unverified certificate names %q", got)
		}
	}
}

// However many handshakes one source leaves hanging, it holds at most its
// share; when every slot is taken, a source holding fewer takes the oldest
// slot of the one holding the most, whose handshake is cancelled.
func TestHandshakeSlotsAreShared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hs := NewHandshakes(16) // 2 a source
	a, b := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	var held []*Handshake
	for range 2 {
		h, _ := hs.Start(ctx, a, time.Minute)
		if h == nil {
			t.Fatal("a source refused its share")
		}
		held = append(held, h)
	}
	if h, _ := hs.Start(ctx, a, time.Minute); h != nil {
		t.Fatal("a source took more than its share")
	}
	for i := range 14 {
		src := netip.AddrFrom4([4]byte{10, 0, byte(i / 2), 1})
		if h, _ := hs.Start(ctx, src, time.Minute); h == nil {
			t.Fatalf("source %v refused with slots free", src)
		}
	}
	if hs.InProgress() != 16 {
		t.Fatalf("%d in progress, want 16", hs.InProgress())
	}
	// Full: b holds none, the most any source holds is 2.
	h, evicted := hs.Start(ctx, b, time.Minute)
	if h == nil || !evicted {
		t.Fatalf("a newcomer was refused (%v) or took a free slot (evicted %v)", h == nil, evicted)
	}
	victim := 0
	for _, h := range held {
		if h.Ctx.Err() != nil {
			victim++
		}
	}
	if victim > 1 || hs.InProgress() != 16 {
		t.Errorf("%d of a's handshakes cancelled, %d in progress; want at most 1, 16", victim, hs.InProgress())
	}
	if !hs.Done(b, h) || hs.Done(b, h) {
		t.Error("Done: true once for a handshake that ran, then false")
	}
	if hs.InProgress() != 15 {
		t.Errorf("%d in progress after one done, want 15", hs.InProgress())
	}
}

func TestAHandshakeEndsAtItsTimeout(t *testing.T) {
	t.Parallel()
	hs := NewHandshakes(4)
	h, _ := hs.Start(context.Background(), netip.MustParseAddr("127.0.0.2"), time.Millisecond)
	select {
	case <-h.Ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the handshake's context outlived its timeout")
	}
}
