#include "listen_socket.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Splits "host:port" / "[v6]:port" into host and port. 0 / -1. */
static int split_addr(const char *addr, char *host, size_t host_size, char *port,
                      size_t port_size)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1])
        return -1;
    size_t hl = (size_t)(colon - addr);
    const char *h = addr;
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return -1;
        h++;
        hl -= 2;
    }
    if (hl >= host_size || strlen(colon + 1) >= port_size)
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    strcpy(port, colon + 1);
    for (const char *p = port; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    return 0;
}

enum charged_rc listen_socket_open(const char *name, const char *addr, int *fd,
                                   int *port, struct charged_error *err)
{
    char host[256], service[16];
    struct addrinfo hints, *res = NULL;
    int errnum = 0, s = -1;

    if (split_addr(addr, host, sizeof(host), service, sizeof(service)) != 0) {
        charged_error_set(err, "%s: '%s' is not host:port", name, addr);
        return CHARGED_GIVE_UP;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        charged_error_set(err, "%s: cannot resolve '%s': %s", name, host,
                          gai_strerror(gai));
        return CHARGED_GIVE_UP;
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int one = 1;
        s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (s < 0) {
            errnum = errno;
            continue;
        }
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, 64) == 0)
            break;
        errnum = errno;
        close(s);
        s = -1;
    }
    freeaddrinfo(res);
    if (s < 0) {
        charged_error_set(err, "%s: cannot listen on %s: %s", name, addr,
                          strerror(errnum ? errnum : EADDRNOTAVAIL));
        return CHARGED_RETRY;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    *port = 0;
    if (getsockname(s, (struct sockaddr *)&ss, &sl) == 0)
        *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd = s;
    return CHARGED_OK;
}
