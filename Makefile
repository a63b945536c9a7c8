# kunci — see README.md.
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/kunci/kunci/server.Version=$(VERSION)
LISTEN   ?= 127.0.0.1:7070
ADMIN    ?= 127.0.0.1:7071
FUZZTIME ?= 30s

.PHONY: build run test vet bench fuzz clean

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kuncid ./cmd/kuncid

run: build
	./bin/kuncid --listen $(LISTEN) --admin $(ADMIN)

vet:
	$(GO) vet ./...

test: vet
	$(GO) test -race -count=1 ./...

bench:
	$(GO) test -run=NONE -bench=. -benchmem ./wire/ ./engine/... ./server/

fuzz:
	$(GO) test -run=NONE -fuzz=FuzzParseRequest -fuzztime=$(FUZZTIME) ./wire/
	$(GO) test -run=NONE -fuzz=FuzzParseAnswer -fuzztime=$(FUZZTIME) ./wire/

clean:
	rm -rf bin
