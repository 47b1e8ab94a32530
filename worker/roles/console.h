/* console: the `charged console` role. The operator console in a browser,
 * on its own listener (CONSOLE_ADDR): the overview, the review queue, dead
 * letters and an attempt's story, behind operator tokens. See
 * docs/console.md. */
#ifndef CHARGED_CONSOLE_H
#define CHARGED_CONSOLE_H

/* The role's main: reads the environment, runs until SIGTERM. Returns the
 * process's exit status. */
int console_main(int argc, char **argv);

#endif
