package sinktest

import (
	"net"
	"os"
	"syscall"
)

// ListenBacklog listens on a free loopback port with the given accept
// backlog (Go's net.Listen always asks for somaxconn). Connections beyond
// it wait in SYN retransmits, as with Python's http.server (backlog 5).
func ListenBacklog(backlog int) (net.Listener, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Listen(fd, backlog); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close() // FileListener dups the descriptor
	return net.FileListener(f)
}
