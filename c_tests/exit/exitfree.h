/* What the exit_frees program and its libraries share. */
#ifndef EXITFREE_H
#define EXITFREE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks of each kind of exit-time free. */
#define EXIT_BLOCKS 10
/* Their size, found by nothing else in the program. */
#define EXIT_BLOCK_SIZE 4321

/* Blocks freed after the session ended (the trace counts them lost). */
#define LATE_BLOCKS 7
/* Their size. */
#define LATE_BLOCK_SIZE 1234

void exitfree_at_destructor(int i, void *p);
void exitfree_after_end(int i, void *p);
void exitfree_at_handler(int i, void *p);
void exitcxx_keep(int i, void *p);

#ifdef __cplusplus
}
#endif

#endif
