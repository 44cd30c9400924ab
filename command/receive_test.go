package command

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReceiverVerifiesStandardWebhookSignature(t *testing.T) {
	secret, err := webhookSecretBytes("whsec_" + base64.StdEncoding.EncodeToString([]byte("s3cret")))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	srv := httptest.NewServer(&receiver{out: &out, secret: secret})
	defer srv.Close()

	body := `{"op":"c"}`
	sign := func(key []byte) string {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte("msg_1.1700000000." + body))
		return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	}
	post := func(sig string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hook", strings.NewReader(body))
		req.Header.Set("webhook-id", "msg_1")
		req.Header.Set("webhook-timestamp", "1700000000")
		req.Header.Set("webhook-signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got, want := post(sign([]byte("wrong"))), http.StatusUnauthorized; got != want {
		t.Fatalf("bad signature: status %d, want %d", got, want)
	}
	if got, want := post("v1,bogus "+sign([]byte("s3cret"))), http.StatusNoContent; got != want {
		t.Fatalf("good signature among several: status %d, want %d", got, want)
	}
	if got, want := out.String(), body+"\n"; got != want {
		t.Fatalf("printed %q, want %q", got, want)
	}
}

func TestWebhookSecretRejectsBadBase64(t *testing.T) {
	if _, err := webhookSecretBytes("whsec_!!!"); err == nil {
		t.Fatal("want an error for a whsec_ secret that is not base64")
	}
	if b, _ := webhookSecretBytes("plain"); string(b) != "plain" {
		t.Fatalf("raw secret = %q", b)
	}
}
