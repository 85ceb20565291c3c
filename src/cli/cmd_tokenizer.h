/* loom tokenizer: GPT-2 byte-level BPE from the command line (encode, decode, train). */
#ifndef LOOM_CLI_CMD_TOKENIZER_H
#define LOOM_CLI_CMD_TOKENIZER_H

/* argv[0] is "tokenizer", argv[1] the subcommand. Returns 0 on success, 2 on any error
 * (one line "loom tokenizer: ..." on stderr). */
int loom_cmd_tokenizer(int argc, char **argv);

#endif
