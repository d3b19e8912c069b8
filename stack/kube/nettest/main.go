// nettest: a tiny static network probe for the cluster checks of stack/kube/kube.sh (no busybox,
// no image registry: this binary is the whole image).
//
//	nettest serve ADDR          accept TCP connections on ADDR and answer "ok <hostname>\n"
//	nettest dial ADDR [SECONDS] connect to ADDR, print the answer; exit 1 if it fails in time
//	nettest connect ADDR        only open a TCP connection to ADDR (for servers that do not speak first)
//	nettest resolve NAME [DNS]  print NAME's addresses (the pod's resolver: cluster DNS; or ask DNS, host:port)
//	nettest routes              print the pod's IPv4 routes (from /proc/net/route); exit 1 if one is a default route
//	nettest sleep               wait for SIGTERM
package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: nettest serve ADDR | dial ADDR [SECONDS] | connect ADDR | resolve NAME [DNS] | routes | sleep")
	}
	switch os.Args[1] {
	case "serve":
		need(3)
		ln, err := net.Listen("tcp", os.Args[2])
		if err != nil {
			fail(err.Error())
		}
		host, _ := os.Hostname()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					continue
				}
				fmt.Fprintf(c, "ok %s\n", host)
				c.Close()
			}
		}()
		waitForSignal()
	case "dial":
		need(3)
		timeout := 3 * time.Second
		if len(os.Args) > 3 {
			s, err := strconv.ParseFloat(os.Args[3], 64)
			if err != nil {
				fail(err.Error())
			}
			timeout = time.Duration(s * float64(time.Second))
		}
		c, err := net.DialTimeout("tcp", os.Args[2], timeout)
		if err != nil {
			fail(err.Error())
		}
		c.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fail(err.Error())
		}
		fmt.Print(line)
	case "connect":
		need(3)
		c, err := net.DialTimeout("tcp", os.Args[2], 3*time.Second)
		if err != nil {
			fail(err.Error())
		}
		fmt.Printf("connected to %s from %s\n", c.RemoteAddr(), c.LocalAddr())
		c.Close()
	case "resolve":
		need(3)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resolver := net.DefaultResolver
		if len(os.Args) > 3 {
			server := os.Args[3]
			resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, server)
			}}
		}
		addrs, err := resolver.LookupHost(ctx, os.Args[2])
		if err != nil {
			fail(err.Error())
		}
		for _, a := range addrs {
			fmt.Println(a)
		}
	case "routes":
		data, err := os.ReadFile("/proc/net/route")
		if err != nil {
			fail(err.Error())
		}
		hasDefault := false
		for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			f := strings.Fields(line)
			if i == 0 || len(f) < 8 {
				continue
			}
			dst, gw, mask := hexIP(f[1]), hexIP(f[2]), hexIP(f[7])
			fmt.Printf("%s/%s via %s dev %s\n", dst, mask, gw, f[0])
			if f[1] == "00000000" && f[7] == "00000000" {
				hasDefault = true
			}
		}
		if hasDefault {
			fail("a default route is present")
		}
	case "sleep":
		waitForSignal()
	default:
		fail("unknown command " + os.Args[1])
	}
}

// hexIP turns /proc/net/route's little-endian hex address into dotted form.
func hexIP(h string) string {
	v, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return h
	}
	return fmt.Sprintf("%d.%d.%d.%d", byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

func need(n int) {
	if len(os.Args) < n {
		fail("missing argument")
	}
}

func waitForSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "nettest:", msg)
	os.Exit(1)
}
