// Command uploadbench uploads files to a store the way a checkpoint commit
// does (all files concurrently, sha256 while streaming, plain io.Reader)
// and prints throughput and the process's peak RSS. With -serve it runs
// the in-process fake S3 instead and prints its environment.
//
//	go run ./bench/cmd/uploadbench -serve &   # prints AWS_* lines
//	env AWS_...=... go run ./bench/cmd/uploadbench -store s3://spotagent-test/bench f1 f2 f3 f4
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/all"
)

func main() {
	serve := flag.Bool("serve", false, "run a fake S3 server until interrupted")
	uri := flag.String("store", "", "store URI")
	flag.Parse()
	if *serve {
		srv, err := s3test.Start("spotagent-test")
		if err != nil {
			log.Fatal(err)
		}
		for _, kv := range srv.Env() {
			fmt.Println(kv)
		}
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		<-c
		return
	}
	ctx := context.Background()
	st, err := all.Open(ctx, *uri, all.Options{})
	if err != nil {
		log.Fatal(err)
	}
	start := time.Now()
	total, err := upload(ctx, st, flag.Args())
	if err != nil {
		log.Fatal(err)
	}
	secs := time.Since(start).Seconds()
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Printf("uploaded %d MiB in %.2fs: %.0f MB/s, peak RSS %d MB\n", total>>20, secs, float64(total)/secs/1e6, ru.Maxrss/1024)
}

// upload puts each file to st under its base name, all at once, hashing
// it as it streams (as a commit does), and returns the bytes uploaded.
func upload(ctx context.Context, st cloud.Store, names []string) (int64, error) {
	var total atomic.Int64
	var g errgroup.Group
	for _, name := range names {
		g.Go(func() error {
			f, err := os.Open(name)
			if err != nil {
				return err
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			h := sha256.New()
			if err := st.Put(ctx, filepath.Base(name), io.TeeReader(f, h), fi.Size(), cloud.PutOptions{}); err != nil {
				return fmt.Errorf("upload %s: %w", name, err)
			}
			total.Add(fi.Size())
			return nil
		})
	}
	err := g.Wait()
	return total.Load(), err
}
