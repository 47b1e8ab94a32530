/* console_assets: the console's page (worker/roles/console_web/), compiled
 * into the binary by tools/embed_files.cmake: nothing to install beside it,
 * and nothing on disk for anyone to change under a running console. */
#ifndef CHARGED_CONSOLE_ASSETS_H
#define CHARGED_CONSOLE_ASSETS_H

#include <stddef.h>

struct console_asset {
    const char *name; /* "index.html" */
    const char *bytes;
    size_t len;
};

extern const struct console_asset console_assets[];
extern const size_t console_assets_count;

#endif
