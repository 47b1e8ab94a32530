/* listen_socket: a listening TCP socket on "host:port", for the HTTP
 * listeners (the admin listener of every role, the api's).
 *
 * The host is a name or an address ("0.0.0.0", "[::1]"); port 0 takes a
 * free port, which *port names. Binding before anything else starts lets a
 * role refuse to start on a taken port with one clear line. */
#ifndef CHARGED_LISTEN_SOCKET_H
#define CHARGED_LISTEN_SOCKET_H

#include <stddef.h>

#include "charged_error.h"

/* Opens, binds and listens (close-on-exec). `name` names the setting in
 * err ("ADMIN_ADDR"). Returns CHARGED_OK with *fd (the caller owns it) and
 * *port; CHARGED_GIVE_UP with err when addr is not host:port or the host
 * does not resolve (a configuration error); CHARGED_RETRY with err when
 * bind or listen is refused (port taken, no right: the host's state). */
enum charged_rc listen_socket_open(const char *name, const char *addr, int *fd,
                                   int *port, struct charged_error *err);

#endif
