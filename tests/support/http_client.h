/* http_client: one HTTP request from a test to a listener on loopback,
 * with the answer's status, body and the headers tests look at. */
#ifndef CHARGED_TEST_HTTP_CLIENT_H
#define CHARGED_TEST_HTTP_CLIENT_H

#include <stddef.h>

#include <curl/curl.h>

struct http_answer {
    long status; /* 0: no answer */
    char body[65536];
    size_t len;
    char content_type[256], cache_control[256], allow[256];
};

/* Sends method (GET, HEAD, POST with a small form body, or any other verb)
 * for path to 127.0.0.1:port, with a 10 s timeout. Returns curl's code;
 * the answer is in *ans when it is CURLE_OK. */
CURLcode http_client_request(int port, const char *method, const char *path,
                             struct http_answer *ans);

#endif
