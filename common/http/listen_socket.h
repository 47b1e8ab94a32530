/* listen_socket: a listening TCP socket on "host:port", for the HTTP
 * listeners (the admin listener of every role, the api's).
 *
 * The host is a name or an address ("0.0.0.0", "[::1]"); port 0 takes a
 * free port, which *port names. Binding before anything else starts lets a
 * role refuse to start on a taken port with one clear line. */
#ifndef CHARGED_LISTEN_SOCKET_H
#define CHARGED_LISTEN_SOCKET_H

#include <stddef.h>

enum listen_socket_rc {
    LISTEN_SOCKET_OK = 0,
    LISTEN_SOCKET_BAD_ADDRESS,  /* not host:port, or the host does not resolve:
                                   a configuration error */
    LISTEN_SOCKET_CANNOT_LISTEN /* bind or listen refused: port taken, no right */
};

/* Opens, binds and listens (close-on-exec). `name` names the setting in
 * errbuf ("ADMIN_ADDR"). Returns LISTEN_SOCKET_OK with *fd (the caller owns
 * it) and *port, or another rc with errbuf. */
int listen_socket_open(const char *name, const char *addr, int *fd, int *port,
                       char *errbuf, size_t errbuf_size);

#endif
