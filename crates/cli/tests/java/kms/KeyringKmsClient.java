// A parquet-java KMS client over ClearIce's keyring file ({"<master key id>": "<base64>"}),
// wrapping as ClearIce's keyring KMS does: base64(nonce ‖ AES-GCM(master key, aad = id)),
// which is parquet-java's own local wrapping (KeyToolkit.encryptKeyLocally). Test code:
// Spark reads files ClearIce wrote with parquet-java's key tools through it.
// Hadoop conf: parquet.encryption.kms.client.class=KeyringKmsClient,
//              clearice.keyring.path=/path/to/keyring.json
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.hadoop.conf.Configuration;
import org.apache.parquet.crypto.KeyAccessDeniedException;
import org.apache.parquet.crypto.keytools.KeyToolkit;
import org.apache.parquet.crypto.keytools.KmsClient;

public class KeyringKmsClient implements KmsClient {
    private final Map<String, byte[]> keys = new HashMap<>();

    @Override
    public void initialize(Configuration conf, String kmsInstanceID, String kmsInstanceURL, String accessToken)
            throws KeyAccessDeniedException {
        String path = conf.getTrimmed("clearice.keyring.path");
        try {
            String json = new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.UTF_8);
            Matcher m = Pattern.compile("\"([^\"]+)\"\\s*:\\s*\"([^\"]+)\"").matcher(json);
            while (m.find()) {
                keys.put(m.group(1), Base64.getDecoder().decode(m.group(2)));
            }
        } catch (java.io.IOException e) {
            throw new RuntimeException("keyring " + path + ": " + e.getMessage(), e);
        }
    }

    private byte[] master(String id) throws KeyAccessDeniedException {
        byte[] k = keys.get(id);
        if (k == null) {
            throw new KeyAccessDeniedException("no master key '" + id + "' in the keyring");
        }
        return k;
    }

    @Override
    public String wrapKey(byte[] keyBytes, String masterKeyIdentifier) throws KeyAccessDeniedException {
        return KeyToolkit.encryptKeyLocally(keyBytes, master(masterKeyIdentifier),
                masterKeyIdentifier.getBytes(StandardCharsets.UTF_8));
    }

    @Override
    public byte[] unwrapKey(String wrappedKey, String masterKeyIdentifier) throws KeyAccessDeniedException {
        return KeyToolkit.decryptKeyLocally(wrappedKey, master(masterKeyIdentifier),
                masterKeyIdentifier.getBytes(StandardCharsets.UTF_8));
    }
}
