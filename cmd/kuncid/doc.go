// Command kuncid runs a kunci lock node.
//
// Every flag can also be set from the environment: --max-keys from
// KUNCI_MAX_KEYS, and so on; a flag on the command line wins. Run
// kuncid --help for the list.
package main
