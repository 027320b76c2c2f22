/* A shared object that is not a specinfer plugin: it exports no specinfer_plugin_entry. */
__attribute__((visibility("default"))) int not_a_specinfer_plugin(void) {
  return 42;
}
